"""The `preprocessing` model: validate, apply the chat template, tokenize (CPU, several instances)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import triton_python_backend_utils as pb_utils

from bucketserve.engine.guided import check_guide
from bucketserve.scheduling.admission import check_prompt_bytes
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.contract import (
    INPUT_NAMES,
    GenerateParams,
    check_context,
    parse_params,
    text_input,
)
from bucketserve.serving.core.messages import seal_message
from bucketserve.serving.core.model_info import load_tokenizer, model_info
from bucketserve.serving.models.overload import prompt_byte_limit
from bucketserve.serving.models.triton_io import bytes_tensor, model_parameter, read_inputs


class Preprocessor:
    """Turns the user tensors into (prompt token ids, GenerateParams); pure of Triton."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.info = model_info(cfg)
        self.tokenizer = load_tokenizer(self.info)
        self.max_prompt_bytes = prompt_byte_limit(self.tokenizer, self.info.max_model_len)

    def encode(self, text: str, chat: bool) -> list[int]:
        if chat and getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": text}]
            # return_dict=False: transformers 5 returns a BatchEncoding (keys) by default
            # (docs/platform-notes.md#p13-transformers-5-config-and-chat-template).
            return list(self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False))  # fmt: skip
        return self.tokenizer.encode(text)

    def __call__(
        self, inputs: dict[str, np.ndarray], request_id: str
    ) -> tuple[list[int], GenerateParams]:
        params = parse_params(inputs, self.cfg.default_max_tokens)
        params.request_id = request_id
        if params.stop:
            return [], params
        check_guide(params.sampling)  # a schema that does not compile: 400 before generation
        text = text_input(inputs.get("text_input"))
        # before tokenizing megabytes: docs/platform-notes.md#p28-no-grpc-message-size-cap
        check_prompt_bytes(text, self.max_prompt_bytes)
        ids = self.encode(text, params.apply_chat_template)
        check_context(params, len(ids), self.info.max_model_len)
        if params.bad_words:  # token sequences the sampler must not complete
            bad = [self.tokenizer.encode(w, add_special_tokens=False) for w in params.bad_words]
            params.sampling = replace(params.sampling, bad_words_ids=tuple(map(tuple, bad)))
        params.num_input_tokens = len(ids)
        if not params.exclude_input_in_output:
            params.prompt_text = text
        return ids, params


class PreprocessModel:
    """Triton lifecycle around Preprocessor; errors become error responses, never exceptions."""

    def initialize(self, args: dict) -> None:
        self.pre = Preprocessor(ServeConfig.read(model_parameter(args, "run_config")))

    def execute(self, requests: list) -> list:
        return [self.one(r) for r in requests]

    def one(self, request):
        try:
            ids, params = self.pre(read_inputs(request, INPUT_NAMES), request.request_id())
        except ValueError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
        ids = np.asarray(ids, dtype=np.int32)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("_input_ids", ids),
                bytes_tensor("_params", seal_message(params, ids.tobytes())),
            ]
        )

    def finalize(self) -> None:
        self.pre = None

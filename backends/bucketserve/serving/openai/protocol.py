"""OpenAI request bodies (pydantic) and the error object; what we cannot do is a 400 by field."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bucketserve.serving.front.errors import openai_body

MAX_TOP_LOGPROBS = 20
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
# vLLM's structured-output request fields (clients send them with extra_body), passed on as
# the vLLM-backend `sampling_parameters` keys of the same names.
GUIDE_EXTRAS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                "structured_outputs", "guided_decoding")  # fmt: skip


class OpenAIError(Exception):
    """An error answered in OpenAI's JSON shape."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return openai_body(self.status, self.message, self.param, self.kind)


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class Common(BaseModel):
    """Fields both endpoints share. Unknown fields are ignored, as OpenAI-compatible servers do."""

    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=2**64 - 1)
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM-style extensions (clients pass them with extra_body)
    top_k: int | None = Field(None, ge=-1)
    min_tokens: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    cache_salt: str | None = Field(None, min_length=1, max_length=256)  # prefix-cache tenant

    def check_common(self) -> None:
        if self.n != 1:
            raise OpenAIError(400, f"n={self.n} is not supported; supported: 1", "n")

    def sampling(self, max_tokens: int | None, logprobs: int | None) -> dict:
        """The vLLM-backend `sampling_parameters` JSON for this request."""
        out = {"max_tokens": max_tokens, "temperature": self.temperature, "top_p": self.top_p,
               "seed": self.seed, "stop": self.stop, "presence_penalty": self.presence_penalty,
               "frequency_penalty": self.frequency_penalty, "logprobs": logprobs,
               "top_k": self.top_k, "min_tokens": self.min_tokens,
               "repetition_penalty": self.repetition_penalty,
               "cache_salt": self.cache_salt}  # fmt: skip
        out |= {k: v for k, v in (self.model_extra or {}).items() if k in GUIDE_EXTRAS}
        return {k: v for k, v in out.items() if v is not None}


class ChatRequest(Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    def check(self) -> None:
        self.check_common()
        if self.tools:
            raise OpenAIError(400, "tools are not supported", "tools")
        if self.tool_choice not in (None, "none"):
            raise OpenAIError(400, "tool_choice is not supported", "tool_choice")
        response_guide(self.response_format)
        if self.top_logprobs is not None and not self.logprobs:
            raise OpenAIError(400, "top_logprobs requires logprobs=true", "top_logprobs")

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def sampling(self, max_tokens: int | None, logprobs: int | None) -> dict:
        """Common's, plus response_format as a vLLM `structured_outputs` object."""
        out = super().sampling(max_tokens, logprobs)
        guide = response_guide(self.response_format)
        return out | {"structured_outputs": guide} if guide else out

    def texts(self) -> list[dict]:
        """Messages for the chat template, content parts joined into text."""
        out = []
        for m in self.messages:
            content = m.content
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
            out.append({"role": m.role, "content": content or ""})
        return out


def response_guide(response_format: dict | None) -> dict | None:
    """OpenAI `response_format` -> vLLM `structured_outputs` (None for text). The schema is
    enforced whatever `strict` says: a server that quietly ignores it is the complaint users
    have; whether the schema compiles is the backend's 400."""
    kind = (response_format or {}).get("type", "text")
    if kind not in RESPONSE_FORMATS:
        raise OpenAIError(400, f"response_format type {kind!r} is not supported; supported: "
                          f"{', '.join(map(repr, RESPONSE_FORMATS))}", "response_format")  # fmt: skip
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise OpenAIError(400, "response_format.json_schema.schema must be a JSON schema object",
                          "response_format")  # fmt: skip
    return {"json": spec["schema"]}


class CompletionRequest(Common):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False

    def check(self) -> None:
        self.check_common()
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise OpenAIError(400, "prompt must be one string (batched prompts are not supported)", "prompt")  # fmt: skip

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

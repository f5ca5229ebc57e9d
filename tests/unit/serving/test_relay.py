"""ResponseRelay without Triton: streaming vs buffered, echo, one FINAL, busy errors, stops."""

from __future__ import annotations

from bucketserve.serving.contract import GenerateParams
from bucketserve.serving.core.decode_stream import Delta
from bucketserve.serving.core.messages import KIND_GENERATE, Handoff
from bucketserve.serving.core.relay import ResponseRelay, merge


class Sender:
    def __init__(self, cancelled: bool = False) -> None:
        self.sent: list[tuple] = []
        self.cancelled = cancelled

    def is_cancelled(self) -> bool:
        return self.cancelled


class Worker:
    def __init__(self) -> None:
        self.submitted, self.cancelled = [], []

    def submit(self, key, handoff) -> None:
        self.submitted.append(key)

    def cancel(self, key) -> None:
        self.cancelled.append(key)


def make():
    worker, finals = Worker(), []

    def send(sender, text, reason, n_in, n_out, final, logprobs=None, num_cached=0):
        sender.sent.append(("ok", text, reason, n_out, final))

    def send_error(sender, message, busy):
        sender.sent.append(("error", message, busy))

    relay = ResponseRelay(worker, send, send_error, lambda d, c: finals.append(d.key))
    return relay, worker, finals


def handoff(**params) -> Handoff:
    return Handoff(KIND_GENERATE, GenerateParams(num_input_tokens=3, **params))


def test_streaming_sends_each_delta_and_one_final():
    relay, worker, finals = make()
    s = Sender()
    relay.start(s, handoff(stream=True, request_id="r1"))
    relay.deliver([Delta(0, "Hel", 1)])
    relay.deliver(merge([Delta(0, "lo", 2), Delta(0, "!", 3, "stop")]))
    assert s.sent == [("ok", "Hel", "", 1, False), ("ok", "lo!", "stop", 3, True)]
    assert finals == [0] and relay.clients == {} and relay.by_request_id == {}


def test_non_streaming_buffers_and_echoes_the_prompt():
    relay, _, _ = make()
    s = Sender()
    relay.start(s, handoff(stream=False, prompt_text="Q: "))
    relay.deliver([Delta(0, "a", 1)])
    relay.deliver([Delta(0, "b", 2, "length")])
    assert s.sent == [("ok", "Q: ab", "length", 2, True)]


def test_busy_error_keeps_its_flag():
    relay, _, finals = make()
    s = Sender()
    relay.start(s, handoff())
    relay.deliver([Delta(0, "", 0, "error", "server busy: ...", busy=True)])
    assert s.sent == [("error", "server busy: ...", True)] and finals == [0]


def test_stop_before_arrival_cancels_on_arrival_and_gone_clients_are_cancelled():
    relay, worker, _ = make()
    relay.stop("late")
    relay.start(Sender(), handoff(request_id="late"))
    assert worker.cancelled == [0]
    relay.start(Sender(cancelled=True), handoff(request_id="gone"))
    relay.cancel_gone()
    assert worker.cancelled == [0, 1]


class FailingSender(Sender):
    """A sender whose responses cannot go out (Triton raised), error FINALs included or not."""

    def __init__(self, errors_too: bool) -> None:
        super().__init__()
        self.errors_too = errors_too


def make_failing():
    worker, finals = Worker(), []

    def send(sender, text, reason, n_in, n_out, final, logprobs=None, num_cached=0):
        if isinstance(sender, FailingSender):
            raise RuntimeError("Unable to send response")
        sender.sent.append(("ok", text, reason, n_out, final))

    def send_error(sender, message, busy):
        if isinstance(sender, FailingSender) and sender.errors_too:
            raise RuntimeError("Unable to send response")
        sender.sent.append(("error", message, busy))

    relay = ResponseRelay(worker, send, send_error, lambda d, c: finals.append((d.key, d.error)))
    return relay, worker, finals


def test_a_failed_send_ends_that_request_only():
    relay, worker, finals = make_failing()
    bad, good = FailingSender(errors_too=False), Sender()
    relay.start(bad, handoff(stream=True, request_id="bad"))
    relay.start(good, handoff(stream=True, request_id="good"))
    assert relay.deliver([Delta(0, "a", 1), Delta(1, "b", 1)])  # the bad one ended
    assert bad.sent == [("error", "decode: could not send a response: Unable to send response",
                         False)]  # fmt: skip
    assert worker.cancelled == [0] and 0 not in relay.clients and "bad" not in relay.by_request_id
    assert finals == [(0, "send failed: Unable to send response")]
    relay.deliver([Delta(0, "", 1, "cancelled"), Delta(1, "c", 2, "stop")])  # nothing more for 0
    assert good.sent == [("ok", "b", "", 1, False), ("ok", "c", "stop", 2, True)]
    assert [k for k, _ in finals] == [0, 1]


def test_a_failed_final_still_frees_the_request_and_keeps_the_relay_going():
    relay, _, finals = make_failing()
    bad, good = FailingSender(errors_too=True), Sender()
    relay.start(bad, handoff(stream=True))
    relay.start(good, handoff(stream=True))
    assert relay.deliver([Delta(0, "a", 1, "stop"), Delta(1, "b", 1, "length")])
    assert bad.sent == [] and good.sent == [("ok", "b", "length", 1, True)]
    assert [k for k, _ in finals] == [0, 1] and relay.clients == {}

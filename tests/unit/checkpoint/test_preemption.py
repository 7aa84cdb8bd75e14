import http.server
import os
import signal
import threading
import time

import pytest

from voxrelay.checkpoint import preemption as pre


class _Metadata(http.server.BaseHTTPRequestHandler):
    """GCP- and AWS-like metadata endpoints on 127.0.0.1; ``preempted`` flips the answer."""

    preempted = False

    def do_GET(self):  # noqa: N802
        if self.path.endswith("/instance/preempted"):
            ok = self.headers.get("Metadata-Flavor") == "Google"
            self._reply(200 if ok else 403, b"TRUE" if self.preempted else b"FALSE")
        elif self.path.endswith("/meta-data/spot/instance-action"):
            ok = self.headers.get("X-aws-ec2-metadata-token") == "tok"
            if not ok:
                self._reply(401, b"")
            else:
                self._reply(200, b'{"action": "terminate"}') if self.preempted else self._reply(404, b"")
        else:
            self._reply(404, b"")

    def do_PUT(self):  # noqa: N802
        self._reply(200, b"tok") if self.path.endswith("/api/token") else self._reply(404, b"")

    def _reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _until(condition, timeout: float = 30.0) -> bool:
    """Wait for ``condition`` (generous timeout: a loaded host is slow, never wrong)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _count_polls(monkeypatch, cloud: str) -> list:
    """Record each poll of ``cloud``'s probe: its answer, or the exception it raised."""
    name = f"{cloud}_preempted"
    probe, polls = getattr(pre, name), []

    def counted(base):
        try:
            polls.append(probe(base))
        except Exception as err:
            polls.append(err)
            raise
        return polls[-1]

    monkeypatch.setattr(pre, name, counted)
    return polls


@pytest.fixture
def metadata():
    _Metadata.preempted = False
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Metadata
    server.shutdown()


def test_gcp_and_aws_probes(metadata):
    url, handler = metadata
    assert not pre.gcp_preempted(url) and not pre.aws_preempted(url)
    handler.preempted = True
    assert pre.gcp_preempted(url) and pre.aws_preempted(url)


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_watcher_polls_metadata(metadata, cloud, monkeypatch):
    url, handler = metadata
    polls = _count_polls(monkeypatch, cloud)
    with pre.PreemptionWatcher(cloud, poll_every=0.05, metadata_url=url) as watcher:
        assert _until(lambda: len(polls) >= 3)  # answered "not preempted" three times
        assert watcher.stop_reason is None
        handler.preempted = True
        assert _until(lambda: watcher.stop_reason is not None)
        assert watcher.stop_reason == "preemption notice from the metadata server"


def test_unreachable_metadata_server_is_not_a_preemption(monkeypatch):
    polls = _count_polls(monkeypatch, "gcp")
    with pre.PreemptionWatcher("gcp", poll_every=0.05, metadata_url="http://127.0.0.1:9") as watcher:
        assert _until(lambda: len(polls) >= 3)  # three refused connections
        assert all(isinstance(p, OSError) for p in polls[:3]), polls
        assert watcher.stop_reason is None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_signals_request_a_stop_and_handlers_are_restored(sig):
    before = signal.getsignal(sig)
    with pre.PreemptionWatcher("off") as watcher:
        os.kill(os.getpid(), sig)
        assert _until(lambda: watcher.stop_reason is not None)
        assert watcher.stop_reason == signal.Signals(sig).name
    assert signal.getsignal(sig) == before


def test_save_trigger_steps_minutes_and_young_daly():
    assert pre.young_daly_interval(2.0, 3600) == pytest.approx((2 * 2.0 * 3600) ** 0.5)
    by_steps = pre.SaveTrigger(every_steps=5, every_minutes=None, mtbf_s=None)
    assert [s for s in range(1, 16) if by_steps.due(s)] == [5, 10, 15]
    by_time = pre.SaveTrigger(every_steps=None, every_minutes=0.001, mtbf_s=None)
    assert not pre.SaveTrigger(None, None, None).due(7)
    time.sleep(0.07)
    assert by_time.due(1)
    by_time.saved(0.01)
    assert not by_time.due(2)
    adaptive = pre.SaveTrigger(every_steps=None, every_minutes=None, mtbf_s=3600)
    adaptive.saved(0.5)
    assert adaptive.interval_s() == pytest.approx(60.0)  # sqrt(2 * 0.5 * 3600)
    adaptive.saved(2.0)  # a slower save stretches the interval (smoothed)
    assert 60.0 < adaptive.interval_s() < pre.young_daly_interval(2.0, 3600)


def test_save_trigger_every_epochs_fires_when_the_cursor_enters_the_next_pass():
    """checkpoint.every_epochs=2 from a cursor in epoch 1 (a resumed run): due when the cursor reaches epoch 2,
    then 4; an epoch skipped over (an epoch shorter than a step) still fires once."""
    trigger = pre.SaveTrigger(None, None, None, every_epochs=2, epoch=1)
    cursor_epochs = [1, 1, 2, 2, 3, 5, 5, 6]
    assert [trigger.due(step, e) for step, e in enumerate(cursor_epochs, 1)] == \
        [False, False, True, False, False, True, False, True]
    assert not pre.SaveTrigger(None, None, None).due(3, 9)


class _Flaky(_Metadata):
    """Answers the first polls with bytes that are not HTTP (http.client.BadStatusLine: an HTTPException,
    not an OSError), then like the real server."""

    garbage_left = 3

    def handle_one_request(self):
        if _Flaky.garbage_left > 0:
            _Flaky.garbage_left -= 1
            self.rfile.readline()
            self.wfile.write(b"not http at all\r\n\r\n")
            self.close_connection = True
            return
        super().handle_one_request()


def test_the_poller_survives_a_malformed_answer_and_sees_the_notice_after_it():
    _Flaky.garbage_left, _Flaky.preempted = 3, True
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pre.PreemptionWatcher("gcp", poll_every=0.05, metadata_url=f"http://127.0.0.1:{server.server_address[1]}"
                                   ) as watcher:
            _until(lambda: watcher.stop_reason is not None)
        assert _Flaky.garbage_left == 0  # the malformed answers were really given
        assert watcher.stop_reason == "preemption notice from the metadata server"
    finally:
        server.shutdown()


def test_a_notice_records_its_time_for_the_grace_period():
    with pre.PreemptionWatcher("off") as watcher:
        before = time.time()
        os.kill(os.getpid(), signal.SIGTERM)
        assert _until(lambda: watcher.noticed_at is not None)
        assert before <= watcher.noticed_at <= time.time()


def test_time_limit_counts_from_the_process_or_the_machine_boot():
    from voxrelay.checkpoint import host

    boot, started = host.boot_time(), pre.process_start_time()
    assert boot is not None and boot < started <= time.time()
    assert pre.session_start("boot") == boot and pre.session_start("process") == started
    deadline = pre.Deadline(session_s=time.time() - boot - 1, total_s=None, started_at=pre.session_start("boot"))
    assert deadline.reached(0.0, 0.0) == pre.TIME_LIMIT  # the machine has been up longer than the limit


def test_the_session_limit_says_from_when_it_counts_and_why_it_is_already_spent():
    """A user on a machine up for 11 h with `time_limit_from: boot` saw a 20 s session end before its first step;
    the first line of `train` now says so."""
    from voxrelay.checkpoint.preemption import Deadline

    now = 1_000_000.0
    booted = Deadline(20.0, None, now - 11 * 3600)
    assert booted.describe("boot", now) == ("train.time_limit: 20 s from the machine's boot (11.0 h ago), 0 s left; "
                                            "already spent: this machine booted long before this session "
                                            "(train.time_limit_from=process counts from the command instead)")
    fresh = Deadline(23.5 * 3600, None, now - 90)
    assert fresh.describe("process", now) == ("train.time_limit: 23.5 h from this process's start (2 min ago), "
                                              "23.5 h left")
    assert Deadline(None, 3600.0, now).describe("boot", now) is None

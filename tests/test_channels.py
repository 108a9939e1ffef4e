"""Endpoints and typed channels over real ipc:// sockets in one process."""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass

import orjson
import pytest
import zmq

from ipc.channels import (
    ChannelError,
    ChannelTimeout,
    DealerChannel,
    PubChannel,
    PullChannel,
    PushChannel,
    RouterChannel,
    SubChannel,
)
from ipc.codec import CodecError, encode, message
from ipc.endpoints import Endpoints, UnsafeRuntimeDir


@message("test.ping")
@dataclass(frozen=True)
class Ping:
    seq: int
    note: str | None = None


@message("test.pong")
@dataclass(frozen=True)
class Pong:
    seq: int


@pytest.fixture
def endpoints(tmp_path):
    eps = Endpoints.create("test-run", num_replicas=2, runtime_root=tmp_path / "rt")
    yield eps
    eps.cleanup()


# --- endpoints -----------------------------------------------------------------------------------


def test_runtime_dir_is_private_and_cleanup_removes_it(tmp_path):
    eps = Endpoints.create("run-1", num_replicas=2, runtime_root=tmp_path / "rt")
    for d in (tmp_path / "rt", eps.runtime_dir):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert eps.scheduler_input == f"ipc://{eps.runtime_dir}/scheduler_input.sock"
    assert eps.doorbell(1) == f"ipc://{eps.runtime_dir}/doorbell.1.sock"
    assert (
        len({eps.tokenizer_frontend, eps.scheduler_input, eps.tokenizer_output, eps.results, *eps.doorbells})
        == 6
    )
    eps.cleanup()
    assert not eps.runtime_dir.exists()
    eps.cleanup()  # twice is fine


def test_tcp_only_for_the_roles_asked_for(tmp_path):
    eps = Endpoints.create("run-tcp", tcp={"results": "10.0.0.2:5555"}, runtime_root=tmp_path / "rt")
    assert eps.results == "tcp://10.0.0.2:5555"
    assert eps.scheduler_input.startswith("ipc://")
    with pytest.raises(ValueError, match=r"unknown role\(s\) \['doorbell.3'\]"):
        Endpoints.create("run-tcp", tcp={"doorbell.3": "h:1"}, runtime_root=tmp_path / "rt")
    with pytest.raises(ValueError, match=r"tcp endpoint for results must be 'host:port'"):
        Endpoints.create("run-tcp", tcp={"results": "nohost"}, runtime_root=tmp_path / "rt")


def test_runtime_dir_with_group_permissions_is_refused(tmp_path):
    root = tmp_path / "rt"
    root.mkdir()
    root.chmod(0o750)
    with pytest.raises(UnsafeRuntimeDir, match=r"has mode 0750"):
        Endpoints.create("run-1", runtime_root=root)


def test_runtime_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "rt"
    root.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(root).st_uid + 1)
    with pytest.raises(UnsafeRuntimeDir, match=r"owned by uid \d+, not by this user"):
        Endpoints.create("run-1", runtime_root=root)


def test_symlinked_runtime_dir_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafeRuntimeDir, match=r"not a directory"):
        Endpoints.create("run-1", runtime_root=tmp_path / "link")


def test_bad_run_id_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"run id '../x'"):
        Endpoints.create("../x", runtime_root=tmp_path / "rt")


# --- channels ------------------------------------------------------------------------------------


def test_push_pull_round_trip(endpoints):
    with (
        PullChannel.bind(endpoints.scheduler_input, name="scheduler input") as pull,
        PushChannel.connect(endpoints.scheduler_input, name="tokenizer out") as push,
    ):
        push.send(Ping(1, "hi"))
        push.send(Ping(2))
        assert pull.recv(timeout_s=2.0) == Ping(1, "hi")
        assert pull.recv(timeout_s=2.0) == Ping(2)


def test_raw_frames_travel_after_the_envelope(endpoints):
    with PullChannel.bind(endpoints.results) as pull, PushChannel.connect(endpoints.results) as push:
        payload = bytearray(range(256)) * 16
        push.send(Ping(3), frames=[memoryview(payload), b"tail"])
        got = pull.recv_with_frames(timeout_s=2.0)
        assert got.message == Ping(3)
        assert [bytes(f) for f in got.frames] == [bytes(payload), b"tail"]


def test_pub_sub_round_trip_with_topic_filter(endpoints):
    address = endpoints.doorbell(0)
    with (
        PubChannel.bind(address, name="doorbell 0") as pub,
        SubChannel.connect(address, topics=(b"r0",)) as sub,
    ):
        # A subscription reaches the publisher asynchronously; publish until the first one lands.
        deadline = time.monotonic() + 5.0
        got = None
        while got is None and time.monotonic() < deadline:
            pub.send(Ping(0), topic=b"r1")  # filtered out
            pub.send(Ping(1), topic=b"r0")
            got = sub.recv(timeout_s=0.05)
        assert got == Ping(1)
        while (more := sub.recv(timeout_s=0.05)) is not None:
            assert more == Ping(1)  # never the r1 topic


def test_router_dealer_round_trip_by_identity(endpoints):
    with (
        RouterChannel.bind(endpoints.tokenizer_frontend) as router,
        DealerChannel.connect(endpoints.tokenizer_frontend, identity=b"client-a") as a,
        DealerChannel.connect(endpoints.tokenizer_frontend, identity=b"client-b") as b,
    ):
        a.send(Ping(1))
        b.send(Ping(2))
        got = sorted([router.expect(2.0), router.expect(2.0)], key=lambda r: r.identity)
        assert [(r.identity, r.message) for r in got] == [(b"client-a", Ping(1)), (b"client-b", Ping(2))]
        router.send(b"client-b", Pong(2))
        router.send(b"client-a", Pong(1))
        assert a.expect(2.0) == Pong(1)
        assert b.expect(2.0) == Pong(2)


def test_router_send_to_unknown_identity_names_it(endpoints):
    with (
        RouterChannel.bind(endpoints.tokenizer_frontend, name="frontend") as router,
        pytest.raises(ChannelError, match=r"channel frontend: cannot send test.pong to identity b'ghost'"),
    ):
        router.send(b"ghost", Pong(1))


def test_receive_timeout_fires_in_about_the_asked_time(endpoints):
    with PullChannel.bind(endpoints.results, name="results") as pull:
        t0 = time.monotonic()
        assert pull.recv(timeout_s=0.2) is None
        elapsed = time.monotonic() - t0
        assert 0.18 <= elapsed < 0.6
        with pytest.raises(ChannelTimeout, match=r"channel results: no message within 0.05 s"):
            pull.expect(0.05)


def test_send_without_a_peer_times_out_instead_of_hanging(endpoints):
    with (
        PushChannel.bind(endpoints.results, name="results", send_timeout_s=0.1) as push,
        pytest.raises(ChannelTimeout, match=r"channel results: could not send test.ping within 0.1 s"),
    ):
        push.send(Ping(1))


def test_malformed_frame_does_not_kill_the_receiving_loop(endpoints):
    received, errors = [], []

    def loop(pull: PullChannel) -> None:
        while len(received) < 2:
            try:
                msg = pull.recv(timeout_s=2.0)
            except CodecError as e:  # what a process loop does: log and carry on
                errors.append(str(e))
                continue
            if msg is None:
                return
            received.append(msg)

    with PullChannel.bind(endpoints.scheduler_input, name="scheduler input") as pull:
        thread = threading.Thread(target=loop, args=(pull,))
        thread.start()
        raw = zmq.Context.instance().socket(zmq.PUSH)
        raw.linger = 0
        raw.connect(endpoints.scheduler_input)
        try:
            raw.send(encode(Ping(1)))
            raw.send(b"not json at all")
            raw.send(orjson.dumps({"type": "test.ping", "body": {"seq": "one"}}))
            raw.send(orjson.dumps({"type": "Evil", "body": {}}))
            raw.send(encode(Ping(2)))
            thread.join(timeout=5.0)
        finally:
            raw.close()
        assert not thread.is_alive()
    assert received == [Ping(1), Ping(2)]
    assert len(errors) == 3
    assert all(e.startswith("channel scheduler input: ") for e in errors)
    assert "not valid JSON" in errors[0]
    assert "field 'seq': expected int" in errors[1]
    assert "unknown message type 'Evil'" in errors[2]


def test_channel_restricted_to_types_rejects_others(endpoints):
    with (
        PullChannel.bind(endpoints.results, types=(Pong,)) as pull,
        PushChannel.connect(endpoints.results) as push,
    ):
        push.send(Ping(1))
        with pytest.raises(CodecError, match=r"expected Pong, got test.ping"):
            pull.recv(timeout_s=2.0)
        push.send(Pong(1))
        assert pull.recv(timeout_s=2.0) == Pong(1)


def test_close_with_undelivered_messages_returns_promptly(endpoints):
    push = PushChannel.connect(endpoints.results)  # nobody ever binds
    push.send(Ping(1))  # queued on the connecting pipe, never delivered
    t0 = time.monotonic()
    push.close()
    assert push.closed and time.monotonic() - t0 < 1.0

"""What a user reads of a transport error: gloo's own cause, without torch's advice to its
developers ("... GLHF!") or a C++ source location."""

from __future__ import annotations

from shoal.comm.links import describe_failure
from shoal.errors import plain_error
from shoal.launch.reports import build_report

#: a server's receive from a worker that was killed, as torch 2.13's gloo says it
GLOO = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:538] Connection closed by peer "
    "[127.0.0.1]:46772. This is typically caused by a remote worker crashing. Check the logs "
    "of the remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f"
)


def test_torchs_advice_and_the_source_location_are_dropped() -> None:
    assert plain_error(GLOO) == "Connection closed by peer [127.0.0.1]:46772."
    assert describe_failure(RuntimeError(GLOO)) == "Connection closed by peer [127.0.0.1]:46772."
    report = build_report(2, 6, RuntimeError(GLOO))
    assert report["message"] == "Connection closed by peer [127.0.0.1]:46772."
    assert report["communication_error"] is True
    assert plain_error("Read error [127.0.0.1]:1: Connection reset by peer") == (
        "Read error [127.0.0.1]:1: Connection reset by peer"
    )

"""The node agents' API client (kube/apiserver.py) raises OSError and nothing else, whatever the
apiserver or the network does: the agents catch OSError around every call, so an answer cut off
mid-body or a body that is not JSON must not escape as another type and end a loop."""

from __future__ import annotations

from urllib.error import HTTPError, URLError

import pytest

from ix_gpu.kube.apiserver import ApiError, ApiServer
from tests.dra.fake_resource_api import FakeResourceApi, serving
from tests.support.net import free_port

PATH = "/api/v1/nodes/n1"


@pytest.mark.parametrize(
    ("fault", "kind", "says"),
    [
        ("cut", ApiError, "GET /api/v1/nodes/n1: the answer was cut off"),
        ("junk", ApiError, "the answer is not JSON"),
        ("deep", ApiError, "the answer is nested too deep"),
        ("500", HTTPError, "HTTP Error 500"),
    ],
)
def test_every_fault_is_an_oserror_that_names_the_call(fault: str, kind: type[OSError], says: str) -> None:
    fake = FakeResourceApi()
    fake.add_node("n1")
    fake.faults[PATH] = fault
    with serving(fake) as api:
        with pytest.raises(kind) as raised:
            api.request("GET", PATH)
        assert isinstance(raised.value, OSError)
        assert says in str(raised.value)
        del fake.faults[PATH]
        assert api.request("GET", PATH)["metadata"]["name"] == "n1", "the next call works"


def test_an_answer_over_the_limit_is_an_api_error() -> None:
    fake = FakeResourceApi()
    fake.add_node("n1", labels={"big": "x" * 5000})
    with serving(fake) as api, pytest.raises(ApiError, match="larger than 1000 bytes"):
        api.request("GET", PATH, max_bytes=1000)


def test_nobody_listening_is_a_url_error() -> None:
    api = ApiServer(f"http://127.0.0.1:{free_port()}", "t", None)
    with pytest.raises(URLError):
        api.request("GET", PATH, timeout=2)

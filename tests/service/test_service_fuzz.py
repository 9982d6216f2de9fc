"""Fuzz the HTTPS endpoint: at least 20,000 malformed or random bodies, no 5xx, process alive.

Hypothesis generates batches of bodies (one example = one batch, so its per-example overhead is
paid once per ten requests) sent over one keep-alive connection to the shared local server:
random bytes, random JSON, valid reviews with one field replaced or removed, truncated reviews,
and well-formed reviews around random Pod-like objects (which reach the mutation core). Answers
are checked, not just counted: 200s are AdmissionReviews echoing the uid whose patch applies to
the object sent; everything else is a 4xx with a one-line JSON error; and the webhook's
internal-error counter stays 0, so a crash in the core cannot hide behind a tidy denial.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import random
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.objects import container, gpu_tfjob, json_paths, pod, review
from tests.support.webhook_process import WebhookProcess, ca_context

BATCH = 10
EXAMPLES = 2_000
MINIMUM_BODIES = 20_000

JSON_HEADERS = {"content-type": "application/json"}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["1", "0", "-1", "1.5", "2k", "1e3", "0x10", " 1", "Infinity", "", "CREATE", "Pod"]),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
# Inside pod-like objects, small values: the structure around them is where the core branches.
small_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=2) | st.dictionaries(st.text(max_size=6), children, max_size=2)
    ),
    max_leaves=3,
)
resource_names = st.sampled_from(
    ["iluvatar.com/gpu", "nvidia.com/gpu", "cpu", "memory", "nvidia.com/mig-1g.5gb"]
)


@st.composite
def pod_like(draw: st.DrawFn) -> dict[str, Any]:
    """Pods whose structure is mostly right and whose details are anything."""
    containers = []
    for i in range(draw(st.integers(0, 2))):
        body: dict[str, Any] = container(f"c{i}")
        if draw(st.booleans()):
            limits = draw(st.dictionaries(resource_names, small_values, max_size=2))
            requests = draw(st.dictionaries(resource_names, small_values, max_size=2))
            body["resources"] = draw(
                st.sampled_from([{"limits": limits, "requests": requests}, {"limits": limits}])
            )
        if draw(st.booleans()):
            body["env"] = draw(
                st.one_of(small_values, st.lists(st.fixed_dictionaries({"name": st.text(max_size=8)})))
            )
        if draw(st.booleans()):
            body["volumeMounts"] = draw(small_values)
        containers.append(body if draw(st.integers(0, 9)) else draw(small_values))
    obj = pod(containers=containers)
    for key in draw(
        st.lists(st.sampled_from(["volumes", "affinity", "tolerations", "nodeSelector"]), max_size=2)
    ):
        obj["spec"][key] = draw(small_values)
    if draw(st.booleans()):
        obj["metadata"]["annotations"] = draw(
            st.dictionaries(
                st.sampled_from(["ix-gpu.io/inject", "ix-gpu.io/gpu-type", "other"]), small_values
            )
        )
    if draw(st.integers(0, 4)) == 0:
        obj[draw(st.sampled_from(["metadata", "spec", "kind", "apiVersion"]))] = draw(small_values)
    return obj


@st.composite
def damaged_review(draw: st.DrawFn) -> bytes:
    """A valid review with one field replaced by anything, or removed."""
    body = review(draw(st.sampled_from([pod(), gpu_tfjob(), pod(containers=[container("x")])])))
    path = draw(st.sampled_from(json_paths(body)))
    target: Any = body
    for key in path[:-1]:
        target = target[key]
    if draw(st.booleans()):
        target[path[-1]] = draw(json_values)
    elif isinstance(target, dict):
        del target[path[-1]]
    else:
        target.pop(path[-1])
    return json.dumps(body).encode()


@st.composite
def random_review(draw: st.DrawFn) -> bytes:
    obj = draw(pod_like())
    operation = draw(
        st.sampled_from(["CREATE", "CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT", "create", "X"])
    )
    namespace = draw(st.sampled_from(["team-a", "kube-system", ""]) | st.text(max_size=12))
    return json.dumps(
        review(obj, operation=operation, namespace=namespace, dry_run=draw(st.booleans()))
    ).encode()


@st.composite
def truncated_review(draw: st.DrawFn) -> bytes:
    whole = json.dumps(review(pod())).encode()
    return whole[: draw(st.integers(0, len(whole) - 1))]


seeds = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    damaged_review(),
    random_review(),
    truncated_review(),
    st.text(max_size=50).map(lambda t: t.encode("utf-8", "surrogatepass")),
)

_ODD_VALUES: list[Any] = [None, True, 0, -1, 2**70, 1.5, "", "x" * 300, [], {}, [None], {"": None}, "\u0000"]


def _variant(seed: bytes, rng: random.Random) -> bytes:
    """A cheap relative of a Hypothesis-drawn body, driven by a Hypothesis-drawn Random.

    Drawing every body through strategies costs milliseconds each; deriving most of them from a
    drawn seed keeps 20,000 bodies affordable while Hypothesis still controls every byte.
    """
    choice = rng.randrange(4)
    if choice == 0 and seed:
        return seed[: rng.randrange(len(seed))]
    if choice == 1 and seed:
        data = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    try:
        doc = json.loads(seed)
    except ValueError:
        return seed + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    paths = json_paths(doc)
    if not paths:
        return json.dumps(rng.choice(_ODD_VALUES)).encode()
    path = rng.choice(paths)
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    if choice == 2:
        target[path[-1]] = rng.choice(_ODD_VALUES)
    elif isinstance(target, dict):
        del target[path[-1]]
    else:
        target.pop(path[-1])
    return json.dumps(doc).encode()


@st.composite
def batches(draw: st.DrawFn) -> list[bytes]:
    drawn = draw(st.lists(seeds, min_size=2, max_size=2))
    # A drawn seed, not st.randoms(): a HypothesisRandom turns every call into a draw (slow).
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    return drawn + [_variant(rng.choice(drawn), rng) for _ in range(BATCH - len(drawn))]


class KeepAliveClient:
    """One persistent HTTPS connection (stdlib), trusting only the test CA.

    The other service tests use httpx; here its per-request overhead (about 1 ms on this machine,
    more than the server's own time) would double the wall time of 20,000 requests.
    """

    def __init__(self, webhook: WebhookProcess) -> None:
        host, port = webhook.url.removeprefix("https://").rsplit(":", 1)
        self._connect = lambda: http.client.HTTPSConnection(
            host, int(port), context=ca_context(webhook.cert_dir / "ca.crt"), timeout=15
        )
        self._conn = self._connect()
        self.connections = 1

    def post(self, body: bytes) -> tuple[int, bytes]:
        self._conn.request("POST", "/mutate", body=body, headers=JSON_HEADERS)
        response = self._conn.getresponse()
        data = response.read()
        if response.will_close:
            self._conn.close()
            self._conn = self._connect()
            self.connections += 1
        return response.status, data

    def close(self) -> None:
        self._conn.close()


def _check(body: bytes, status: int, answer: bytes) -> None:
    assert status < 500, (body[:300], status, answer[:300])
    if status != 200:
        assert status == 400, (body[:300], status, answer[:300])
        assert b"\n" not in answer and isinstance(json.loads(answer)["error"], str)
        return
    sent = json.loads(body)
    response = json.loads(answer)["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if "patch" in response:
        ops = json.loads(base64.b64decode(response["patch"]))
        jsonpatch.apply_patch(copy.deepcopy(sent["request"]["object"]), ops)


def test_fuzzed_bodies_never_get_a_5xx(local_webhook: WebhookProcess) -> None:
    sent = 0
    client = KeepAliveClient(local_webhook)
    try:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(batches())
        def send(batch: list[bytes]) -> None:
            nonlocal sent
            for body in batch:
                _check(body, *client.post(body))
                sent += 1

        send()
    finally:
        client.close()
    assert sent >= MINIMUM_BODIES
    assert client.connections == 1  # no answer closed the connection: no 413/408 surprises
    with local_webhook.client() as checker:
        assert local_webhook.metric("ix_gpu_admission_internal_errors_total", checker) == 0
        assert checker.get("/healthz").status_code == 200
    assert local_webhook.alive()

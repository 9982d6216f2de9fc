"""The framework floor: FastAPI + orjson, parse the review and answer ``allowed: true``.

No config, no mutation, no metrics, no logs, no namespace facts — the same uvicorn settings and
TLS as the real service, so the difference between the two runs is what ix-gpu itself costs.

    python bench/webhook_load/bare_app.py --cert-dir certs --port 9443
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


@app.post("/mutate")
async def mutate(request: Request) -> Response:
    review = orjson.loads(await request.body())
    answer = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": True},
    }
    return Response(orjson.dumps(answer), media_type="application/json")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert-dir", default="certs")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9443)
    args = parser.parse_args()
    cert_dir = Path(args.cert_dir)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        server_header=False,
        timeout_keep_alive=30,
        log_level="warning",
        ssl_certfile=str(cert_dir / "tls.crt"),
        ssl_keyfile=str(cert_dir / "tls.key"),
    )


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Build the helm v4 CLI from the Go module proxy (helm.sh/helm/v4/cmd/helm at $IX_HELM_VERSION,
# default v4.3.1) for the mini cluster's real-Helm tests: build-go-command.sh does the work (cache
# directory, lock, version stamp); the last stdout line is the bin directory.
set -euo pipefail
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/build-go-command.sh" helm

"""The mutating admission webhook: a pure mutation core and the thin HTTPS service around it."""

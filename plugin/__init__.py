"""The device plugin (kubelet device-plugin API v1beta1)."""

"""The configuration schemas and the strict loader that reads them.

- :mod:`.webhook_config`: the webhook's profiles and policy; :mod:`.plugin_config`: the plugins'
  ``ix-config`` (our format and NVIDIA's).
- :mod:`.schema_base`: the shared pydantic base and the one YAML-to-model loader (errors name the
  line); :mod:`.yaml_input`: the strict YAML reader (size, depth, aliases, duplicate keys);
  :mod:`.input_files`: capped file reads and the error types.
- :mod:`.k8s_names`: the apiserver's name rules; :mod:`.text`: one-line error text for every layer.

It sits on :mod:`ix_gpu.devicemodel` and below both processes; it imports nothing else from
:mod:`ix_gpu`.
"""

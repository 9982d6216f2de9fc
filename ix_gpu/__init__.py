"""The ``ix-gpu`` command line: one entry point for the webhook, the device plugin and their tools."""

"""``python -m rdc_client`` runs the ``rdc`` command."""

from rdc_client.cli import entry

entry()

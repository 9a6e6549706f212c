"""What the exporter and the advisor both need: HTTP serving, exposition text, units, files,
messages, config text. Imports neither of them."""

__version__ = "0.1.0"

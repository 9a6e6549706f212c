"""Collection backends. Each module exposes one `Backend` subclass; `load_backend` picks by name."""

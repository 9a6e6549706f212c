"""One reader per input format, each returning a `Panel`; `advisor.forecast.io.load` picks one."""

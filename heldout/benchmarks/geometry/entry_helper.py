"""Trusted helper written next to a geometry candidate in the sandbox: finds the first entry point
the program defines and calls it; the return value is converted to plain data by the sandbox."""

import importlib


def call(module, entries):
    program = importlib.import_module(module)
    for name in entries:
        fn = getattr(program, name, None)
        if callable(fn):
            return {"entry": name, "value": fn()}
    raise AttributeError(f"the program defines none of the entry points: {', '.join(entries)}")

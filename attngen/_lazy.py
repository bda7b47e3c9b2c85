"""Module attributes loaded on first use (PEP 562), so that importing a package pays only for what is used."""
from importlib import import_module


def lazy_attributes(package: str, attributes: dict, submodules=()):
    """``(__getattr__, __dir__)`` for ``package``: ``attributes`` maps a name to the submodule defining it,
    ``submodules`` are reachable as attributes themselves. A loaded attribute is kept in the package's globals."""
    import sys

    def __getattr__(name):
        if name in submodules:
            return import_module(f".{name}", package)
        module = attributes.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(attributes) | set(submodules))

    return __getattr__, __dir__

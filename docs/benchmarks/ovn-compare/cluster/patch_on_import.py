"""Measurement only (the hooks of write-path/ and followers/): `install(patches)` calls patches[name](module)
on each module of that name as it is first imported, after its own code ran."""
import importlib.abc
import importlib.util
import sys


def install(patches: dict) -> None:
    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in patches:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            exec_module = spec.loader.exec_module

            def patched(module):
                exec_module(module)
                patches[name](module)
            spec.loader.exec_module = patched
            return spec
    sys.meta_path.insert(0, Finder())

"""The REST API of the controller (FastAPI)."""
from fathom.api.app import create_app

__all__ = ["create_app"]

"""API access: configuration and auth from the `kubernetes` package, HTTP/1.1 over asyncio protocols."""

from pykcm.client.config import ClientConfig, ConfigError, load_config
from pykcm.client.errors import ApiError, TransportError
from pykcm.client.resources import Resource
from pykcm.client.rest import RestClient

__all__ = ["ApiError", "ClientConfig", "ConfigError", "Resource", "RestClient", "TransportError", "load_config"]

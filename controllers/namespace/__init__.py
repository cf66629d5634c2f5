"""The namespace controller (KCM's pkg/controller/namespace): `controller` watches namespaces,
`deleter` empties and finalizes a deleted one, `conditions` reports progress on its status."""

from pykcm.controllers.namespace.controller import NamespaceController

__all__ = ["NamespaceController"]

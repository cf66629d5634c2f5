"""Greeter: a ConfigMap labelled `example.pykcm.io/greet: "true"` gets `data.greeting`.

A third-party controller has exactly the shape of pykcm's built-in ones (see
controllers/serviceaccount.py): declare, watch through the shared factory, enqueue keys, sync.
"""

from __future__ import annotations

from pykcm.client.errors import NotFound
from pykcm.client.resources import CONFIGMAPS
from pykcm.client.rest import MERGE_PATCH
from pykcm.controller import Controller, ControllerContext
from pykcm.informers.store import split_key

GREET_LABEL = "example.pykcm.io/greet"


class GreeterController(Controller):
    name = "greeter-controller"
    aliases = ("greeter",)
    queue_name = "greeter"
    enabled_by_default = False  # plugins should be opted into with --controllers

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx)
        self.configmaps = self.informers.informer(CONFIGMAPS)
        self.configmaps.add_event_handler(on_add=self.enqueue, on_update=lambda _old, new: self.enqueue(new))

    async def sync(self, key: str) -> None:
        configmap = self.configmaps.indexer.get(key)
        if configmap is None or configmap["metadata"].get("labels", {}).get(GREET_LABEL) != "true":
            return
        namespace, name = split_key(key)
        greeting = f"hello, {name}"
        if (configmap.get("data") or {}).get("greeting") == greeting:
            return
        try:
            await self.client.patch(
                CONFIGMAPS, name, {"data": {"greeting": greeting}}, namespace=namespace, content_type=MERGE_PATCH
            )
        except NotFound:
            return
        self.log.info("Greeted configmap", configMap=key)

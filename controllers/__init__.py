"""pykcm's built-in controllers, each registered through the `pykcm.controllers` entry-point group."""

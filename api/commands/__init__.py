"""Operator commands of the ``coatcheck`` CLI, one module each; ``api.cli`` only registers them."""

"""Operator and developer sub-commands of ``coatcheck``, one module each (registered in ``api.cli``)."""

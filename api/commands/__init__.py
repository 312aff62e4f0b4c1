"""Operator commands of the ``coatcheck`` command line (registered in ``api.cli``)."""

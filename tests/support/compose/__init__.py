"""Run compose.yaml the way ``docker compose up`` would, on a machine without a Docker engine.

``project`` reads compose.yaml; ``dockerfile`` reads a Dockerfile into what the image would hold, with the
base images' facts from ``images``; ``accounts`` makes the image's users exist here; ``staging`` lays out an
image's files; ``postgres`` plays the ``db`` service; ``up`` starts every service in a private mount
namespace (``launch`` runs inside it).
"""

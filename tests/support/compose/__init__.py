"""Run compose.yaml the way ``docker compose up`` would, on a machine without a Docker engine.

``dockerfile`` reads a Dockerfile into what the image would hold (users, directories and their owners,
copied files, environment, the command), ``images`` knows the base images' facts, ``project`` reads
compose.yaml, ``up`` starts every service in a private mount namespace (``launch`` runs inside it).
"""

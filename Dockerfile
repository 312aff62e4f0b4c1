# Coatcheck application image: `coatcheck serve`, `coatcheck migrate`, `coatcheck seed-demo`.
# Installed as a package (not editable): the migrations ship inside it, so no source tree is needed at run time.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies first, so code edits do not reinstall them: the [project] dependencies of pyproject.toml.
COPY pyproject.toml constraints.txt /src/
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /src/requirements.txt \
    && pip install -r /src/requirements.txt -c /src/constraints.txt

COPY README.md /src/
COPY store /src/store
COPY api /src/api
COPY migrations /src/migrations
RUN pip install -c /src/constraints.txt /src && rm -rf /src

RUN useradd --system --uid 10001 coatcheck
USER coatcheck
WORKDIR /app
EXPOSE 8000
CMD ["coatcheck", "serve", "--host", "0.0.0.0", "--port", "8000"]

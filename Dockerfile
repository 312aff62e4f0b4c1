# Coatcheck application image: `coatcheck serve`, `coatcheck migrate`, `coatcheck seed-demo`.
# Installed as a package, not editable: the migrations ship inside it, so nothing runs from the source tree.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# Dependencies first, so code edits do not reinstall them: the package's skeleton pulls them in.
COPY pyproject.toml constraints.txt README.md ./
COPY store/__init__.py store/__init__.py
COPY api/__init__.py api/__init__.py
COPY migrations/__init__.py migrations/__init__.py
RUN pip install -c constraints.txt '.[otlp]'

# Then the package itself, replacing the skeleton.
COPY store store
COPY api api
COPY migrations migrations
RUN pip install --no-deps --force-reinstall -c constraints.txt .

RUN useradd --system --uid 10001 coatcheck
USER coatcheck
EXPOSE 8000
CMD ["coatcheck", "serve", "--host", "0.0.0.0", "--port", "8000"]

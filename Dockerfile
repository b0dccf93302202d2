# The poimen image: every process (api, worker, outbox, relay) and the
# command-line tools, run as `deno task <name>` (see compose.yaml).
FROM denoland/deno:2.9.6

WORKDIR /app
# /var/lib/poimen holds what must survive restarts (the relay's token, see
# `deno task init`); a named volume mounted there starts with this owner.
RUN chown deno:deno /app \
  && mkdir -p /var/lib/poimen \
  && chown deno:deno /var/lib/poimen

# Never root at run time; the files below stay root's, so the processes
# cannot rewrite their own code.
USER deno

# Dependencies first: this layer is rebuilt only when deno.json or
# deno.lock change, not on every code edit. --frozen: the lockfile is the truth.
COPY deno.json deno.lock ./
RUN deno install --frozen

COPY . .
# Fills DENO_DIR now, not at each start; main.ts's literal dynamic imports
# bring in every command's module graph.
RUN deno install --frozen --entrypoint main.ts

CMD ["task", "api"]

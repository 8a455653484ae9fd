#!/usr/bin/env bash
# Makes sure the services the tests and the demo talk to are up: PostgreSQL and RabbitMQ on
# this machine. Starts whichever is down and waits until it answers; fails loudly otherwise.
set -euo pipefail

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
if ! pg_up; then
    echo "services: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
    for _ in $(seq 1 60); do pg_up && break; sleep 1; done
fi
pg_up || { echo "services: PostgreSQL is not answering on 127.0.0.1:5432" >&2; exit 1; }

if ! timeout 20 rabbitmqctl -q status >/dev/null 2>&1; then
    echo "services: starting RabbitMQ"
    rabbitmq-server -detached
fi
timeout 120 rabbitmqctl -q await_startup >/dev/null \
    || { echo "services: RabbitMQ did not start" >&2; exit 1; }
echo "services: PostgreSQL and RabbitMQ are up"

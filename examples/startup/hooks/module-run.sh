#!/bin/sh
# Runs one module of the example startup. It takes a short, varying moment
# per module; `echo` and `mcplay` fail twice with addon-operator's helm
# message before they succeed, so backoff and a group's Errors: show.
payload=$(cat)
name="$BERTH_TASK_NAME"
# 20..190 ms, varying by module name.
ms=$(( ( $(printf '%s' "$name" | cksum | cut -d' ' -f1) % 18 + 2 ) * 10 ))
sleep "$(printf '0.%03d' "$ms")"
case "$name" in
  echo|mcplay)
    if [ "${BERTH_ATTEMPT:-1}" -le 2 ]; then
      deploy="$name"
      [ "$name" = echo ] && deploy=echo-server
      echo "helm upgrade failed: cannot patch \"$deploy\" with kind Deployment: Deployment.apps \"$deploy\" is invalid: spec.template.spec.containers: Required value" >&2
      exit 1
    fi
    ;;
esac
printf '{"module":"%s","attempt":%s,"took_ms":%s,"payload":%s}\n' "$name" "${BERTH_ATTEMPT:-1}" "$ms" "${payload:-null}"

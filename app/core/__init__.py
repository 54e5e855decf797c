"""Code every process uses: errors, settings, logs, ids, versions, channel framing, telemetry."""

"""Talking to providers: outbound HTTP, signed inbound webhooks, checking tables against samples."""

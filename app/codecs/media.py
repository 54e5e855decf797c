"""The body media types the service reads and writes, shared by routes and services."""

JSON_MEDIA_TYPE = "application/json"
NPZ_MEDIA_TYPE = "application/x-npz"


def is_json_media(media: str | None) -> bool:
    """True for ``application/json`` and any ``+json`` structured suffix."""
    return media is not None and (media == JSON_MEDIA_TYPE or media.endswith("+json"))

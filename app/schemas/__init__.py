"""Request and response models of the HTTP API (pydantic), one module per resource.

Requests are validated with these models. Hot responses (plans with up to hundreds of
thousands of shards, metric arrays) are serialised by hand for speed; the response models
document them in the OpenAPI schema and describe exactly what is sent.
"""

"""The HTTP layer: routing, middleware, caching, limits, OpenAPI and the routes."""

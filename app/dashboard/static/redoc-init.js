// ReDoc over this service's own OpenAPI document.
Redoc.init("/openapi.json", { hideLoading: true }, document.getElementById("redoc"));

"""The dashboard's files: ``static/`` (our HTML, JS and CSS, no build step) and ``vendor/``
(Swagger UI and ReDoc as published on the npm registry, with their licences). They ship
inside the package; :mod:`app.services.dashboard` reads them."""

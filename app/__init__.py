"""The HTTP server: settings, the service, routers made from the analyses' registry, errors mapped once, the wire
codec, the page's routes and the server itself."""

from ..analyses import __version__  # noqa: F401 (the package's version; the web layer reads it here)

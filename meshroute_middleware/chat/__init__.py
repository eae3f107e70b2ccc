"""Serving one chat request: header handling, the attempt lifecycle, forward and annotate
modes and the disconnect watchdog. `meshroute_middleware.middleware` dispatches to them."""

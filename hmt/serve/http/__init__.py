"""The HTTP face: the starlette app, request-body decoding, connection guards and the uvicorn server."""

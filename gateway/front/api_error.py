"""The error the OpenAI front answers with: an HTTP status and OpenAI's error body, naming the
request field at fault when there is one."""
from pdserve.protocol.errors import PdserveError


class ApiError(PdserveError):
    """A request the HTTP front answers with an error status and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

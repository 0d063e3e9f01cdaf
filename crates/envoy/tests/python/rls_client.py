"""A Python gRPC client of Tollgate's Envoy rate limit service, from code that grpcio-tools
generated from the vendored .proto files: calls ShouldRateLimit until it answers OVER_LIMIT.

usage: rls_client.py GENERATED_DIR HOST:PORT
"""
import sys

sys.path.insert(0, sys.argv[1])

import grpc  # noqa: E402
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # noqa: E402
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # noqa: E402


def main():
    target = sys.argv[2]
    with grpc.insecure_channel(target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        desc = ratelimit_pb2.RateLimitDescriptor(
            entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="api_key", value="python")]
        )
        request = rls_pb2.RateLimitRequest(domain="edge", descriptors=[desc], hits_addend=1)
        first = stub.ShouldRateLimit(request, timeout=10)
        assert first.overall_code == rls_pb2.RateLimitResponse.OK, first
        status = first.statuses[0]
        assert status.current_limit.requests_per_unit == 1, status
        assert status.current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.MINUTE, status
        assert status.limit_remaining == 0, status
        second = stub.ShouldRateLimit(request, timeout=10)
        assert second.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT, second
        assert second.statuses[0].code == rls_pb2.RateLimitResponse.OVER_LIMIT, second
        assert 0 < second.statuses[0].duration_until_reset.seconds <= 60, second
        headers = {h.key.lower(): h.value for h in second.response_headers_to_add}
        assert headers["x-ratelimit-limit"] == "1", headers
        assert headers["x-ratelimit-remaining"] == "0", headers
        assert int(headers["retry-after"]) >= 1, headers
        assert headers["ratelimit-policy"] == '"edge.api_key";q=1;w=60', headers
        try:
            stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain=""), timeout=10)
            raise AssertionError("an empty domain was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    print("python client: OVER_LIMIT as expected")


if __name__ == "__main__":
    main()

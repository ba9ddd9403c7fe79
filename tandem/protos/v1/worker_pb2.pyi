from tandem.protos.v1 import tandem_pb2 as _tandem_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_PREFILL: _ClassVar[Role]
    ROLE_DECODE: _ClassVar[Role]
ROLE_UNSPECIFIED: Role
ROLE_PREFILL: Role
ROLE_DECODE: Role

class SuspendRequest(_message.Message):
    __slots__ = ("request_id", "index")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    index: int
    def __init__(self, request_id: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class SuspendResponse(_message.Message):
    __slots__ = ("num_output_tokens",)
    NUM_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    num_output_tokens: int
    def __init__(self, num_output_tokens: _Optional[int] = ...) -> None: ...

class MoveOutRequest(_message.Message):
    __slots__ = ("request_id", "transfer_id", "block_ids", "kv_endpoint", "layout", "skip_tokens", "last_token", "index")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    KV_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SKIP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    transfer_id: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    kv_endpoint: str
    layout: KVLayout
    skip_tokens: int
    last_token: int
    index: int
    def __init__(self, request_id: _Optional[str] = ..., transfer_id: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., kv_endpoint: _Optional[str] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., skip_tokens: _Optional[int] = ..., last_token: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class MoveOutResponse(_message.Message):
    __slots__ = ("bytes", "transfer_s")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    transfer_s: float
    def __init__(self, bytes: _Optional[int] = ..., transfer_s: _Optional[float] = ...) -> None: ...

class PreCopyRequest(_message.Message):
    __slots__ = ("request_id", "index", "transfer_id", "block_ids", "kv_endpoint", "layout", "skip_tokens", "token_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    KV_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SKIP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    index: int
    transfer_id: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    kv_endpoint: str
    layout: KVLayout
    skip_tokens: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., index: _Optional[int] = ..., transfer_id: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., kv_endpoint: _Optional[str] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., skip_tokens: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PreCopyResponse(_message.Message):
    __slots__ = ("bytes", "transfer_s")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    transfer_s: float
    def __init__(self, bytes: _Optional[int] = ..., transfer_s: _Optional[float] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("request_id", "index")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    index: int
    def __init__(self, request_id: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("resumed",)
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    resumed: bool
    def __init__(self, resumed: _Optional[bool] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlipRequest(_message.Message):
    __slots__ = ("to",)
    TO_FIELD_NUMBER: _ClassVar[int]
    to: Role
    def __init__(self, to: _Optional[_Union[Role, str]] = ...) -> None: ...

class FlipResponse(_message.Message):
    __slots__ = ("seconds",)
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    seconds: float
    def __init__(self, seconds: _Optional[float] = ...) -> None: ...

class FlipWorkerRequest(_message.Message):
    __slots__ = ("worker", "to", "force")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    worker: str
    to: Role
    force: bool
    def __init__(self, worker: _Optional[str] = ..., to: _Optional[_Union[Role, str]] = ..., force: _Optional[bool] = ...) -> None: ...

class FlipWorkerResponse(_message.Message):
    __slots__ = ("moved", "seconds")
    MOVED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    moved: MovedStreams
    seconds: float
    def __init__(self, moved: _Optional[_Union[MovedStreams, _Mapping]] = ..., seconds: _Optional[float] = ...) -> None: ...

class DrainWorkerRequest(_message.Message):
    __slots__ = ("worker", "migrate")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    MIGRATE_FIELD_NUMBER: _ClassVar[int]
    worker: str
    migrate: bool
    def __init__(self, worker: _Optional[str] = ..., migrate: _Optional[bool] = ...) -> None: ...

class MoveStreamsRequest(_message.Message):
    __slots__ = ("worker",)
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker: str
    def __init__(self, worker: _Optional[str] = ...) -> None: ...

class MovedStreams(_message.Message):
    __slots__ = ("endpoint", "moved", "stayed", "reasons", "seconds")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    STAYED_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    moved: int
    stayed: int
    reasons: _containers.RepeatedScalarFieldContainer[str]
    seconds: float
    def __init__(self, endpoint: _Optional[str] = ..., moved: _Optional[int] = ..., stayed: _Optional[int] = ..., reasons: _Optional[_Iterable[str]] = ..., seconds: _Optional[float] = ...) -> None: ...

class LoraAdapterRequest(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class LoraAdapterResponse(_message.Message):
    __slots__ = ("identity",)
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    identity: str
    def __init__(self, identity: _Optional[str] = ...) -> None: ...

class ProveRequest(_message.Message):
    __slots__ = ("nonce", "audience")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    AUDIENCE_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    audience: str
    def __init__(self, nonce: _Optional[bytes] = ..., audience: _Optional[str] = ...) -> None: ...

class ProveResponse(_message.Message):
    __slots__ = ("proof", "role")
    PROOF_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    proof: bytes
    role: Role
    def __init__(self, proof: _Optional[bytes] = ..., role: _Optional[_Union[Role, str]] = ...) -> None: ...

class KVLayout(_message.Message):
    __slots__ = ("model", "dtype", "block_size", "num_layers", "num_kv_heads", "head_dim", "fingerprint", "bytes_per_token")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    model: str
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    fingerprint: str
    bytes_per_token: int
    def __init__(self, model: _Optional[str] = ..., dtype: _Optional[str] = ..., block_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., fingerprint: _Optional[str] = ..., bytes_per_token: _Optional[int] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("request_id", "token_ids", "sampling", "logprobs", "lease_s", "prior_output_tokens", "n", "moved_in", "lora", "precopy")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    PRIOR_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    MOVED_IN_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    PRECOPY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _tandem_pb2.SamplingParams
    logprobs: _tandem_pb2.LogprobOptions
    lease_s: float
    prior_output_tokens: int
    n: int
    moved_in: bool
    lora: str
    precopy: bool
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_tandem_pb2.SamplingParams, _Mapping]] = ..., logprobs: _Optional[_Union[_tandem_pb2.LogprobOptions, _Mapping]] = ..., lease_s: _Optional[float] = ..., prior_output_tokens: _Optional[int] = ..., n: _Optional[int] = ..., moved_in: _Optional[bool] = ..., lora: _Optional[str] = ..., precopy: _Optional[bool] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("transfer_id", "block_ids", "kv_endpoint", "layout", "cached_tokens", "lora_identity", "skip_tokens")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    KV_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LORA_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    SKIP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    kv_endpoint: str
    layout: KVLayout
    cached_tokens: int
    lora_identity: str
    skip_tokens: int
    def __init__(self, transfer_id: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., kv_endpoint: _Optional[str] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., cached_tokens: _Optional[int] = ..., lora_identity: _Optional[str] = ..., skip_tokens: _Optional[int] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "token_ids", "sampling", "logprobs", "transfer_id", "block_ids", "kv_endpoint", "layout", "prior_output_tokens", "skip_tokens", "n", "lora", "lora_identity")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    KV_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    PRIOR_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SKIP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    LORA_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _tandem_pb2.SamplingParams
    logprobs: _tandem_pb2.LogprobOptions
    transfer_id: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    kv_endpoint: str
    layout: KVLayout
    prior_output_tokens: int
    skip_tokens: int
    n: int
    lora: str
    lora_identity: str
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_tandem_pb2.SamplingParams, _Mapping]] = ..., logprobs: _Optional[_Union[_tandem_pb2.LogprobOptions, _Mapping]] = ..., transfer_id: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., kv_endpoint: _Optional[str] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., prior_output_tokens: _Optional[int] = ..., skip_tokens: _Optional[int] = ..., n: _Optional[int] = ..., lora: _Optional[str] = ..., lora_identity: _Optional[str] = ...) -> None: ...

class PrefillLocalRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("first_token", "logprob", "cached_tokens", "prefill_s", "transfer_s", "first_logprob", "prompt_logprobs", "first_tokens")
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    first_token: int
    logprob: float
    cached_tokens: int
    prefill_s: float
    transfer_s: float
    first_logprob: _tandem_pb2.TokenLogprob
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_tandem_pb2.TokenLogprob]
    first_tokens: _containers.RepeatedCompositeFieldContainer[_tandem_pb2.TokenLogprob]
    def __init__(self, first_token: _Optional[int] = ..., logprob: _Optional[float] = ..., cached_tokens: _Optional[int] = ..., prefill_s: _Optional[float] = ..., transfer_s: _Optional[float] = ..., first_logprob: _Optional[_Union[_tandem_pb2.TokenLogprob, _Mapping]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_tandem_pb2.TokenLogprob, _Mapping]]] = ..., first_tokens: _Optional[_Iterable[_Union[_tandem_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("request_id", "index")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    index: int
    def __init__(self, request_id: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id", "index")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    index: int
    def __init__(self, request_id: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("role", "worker_id", "num_running", "num_waiting", "num_reserved", "num_free_blocks", "num_blocks", "kv_cache_usage", "prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "draining", "ttft_p50_s", "ttft_p90_s", "itl_p50_s", "itl_p90_s", "kv_transfer_bytes_per_s", "kv_transfer_bytes", "kv_transfer_failures", "num_leased_blocks", "step_base_s", "step_per_row_s", "step_per_prefill_token_s", "pending_prefill_tokens", "max_batched_tokens", "cached_block_hashes", "weights_format", "loras")
    class LorasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROLE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_RESERVED_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    TTFT_P50_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_P90_S_FIELD_NUMBER: _ClassVar[int]
    ITL_P50_S_FIELD_NUMBER: _ClassVar[int]
    ITL_P90_S_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_FAILURES_FIELD_NUMBER: _ClassVar[int]
    NUM_LEASED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    STEP_BASE_S_FIELD_NUMBER: _ClassVar[int]
    STEP_PER_ROW_S_FIELD_NUMBER: _ClassVar[int]
    STEP_PER_PREFILL_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    PENDING_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FORMAT_FIELD_NUMBER: _ClassVar[int]
    LORAS_FIELD_NUMBER: _ClassVar[int]
    role: Role
    worker_id: str
    num_running: int
    num_waiting: int
    num_reserved: int
    num_free_blocks: int
    num_blocks: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    draining: bool
    ttft_p50_s: float
    ttft_p90_s: float
    itl_p50_s: float
    itl_p90_s: float
    kv_transfer_bytes_per_s: float
    kv_transfer_bytes: int
    kv_transfer_failures: int
    num_leased_blocks: int
    step_base_s: float
    step_per_row_s: float
    step_per_prefill_token_s: float
    pending_prefill_tokens: int
    max_batched_tokens: int
    cached_block_hashes: bytes
    weights_format: str
    loras: _containers.ScalarMap[str, str]
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., worker_id: _Optional[str] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_reserved: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_blocks: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., prefix_cache_queries: _Optional[int] = ..., prefix_cache_hits: _Optional[int] = ..., num_preemptions: _Optional[int] = ..., draining: _Optional[bool] = ..., ttft_p50_s: _Optional[float] = ..., ttft_p90_s: _Optional[float] = ..., itl_p50_s: _Optional[float] = ..., itl_p90_s: _Optional[float] = ..., kv_transfer_bytes_per_s: _Optional[float] = ..., kv_transfer_bytes: _Optional[int] = ..., kv_transfer_failures: _Optional[int] = ..., num_leased_blocks: _Optional[int] = ..., step_base_s: _Optional[float] = ..., step_per_row_s: _Optional[float] = ..., step_per_prefill_token_s: _Optional[float] = ..., pending_prefill_tokens: _Optional[int] = ..., max_batched_tokens: _Optional[int] = ..., cached_block_hashes: _Optional[bytes] = ..., weights_format: _Optional[str] = ..., loras: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("role", "worker_id", "endpoint", "kv_endpoint", "layout")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    KV_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    role: Role
    worker_id: str
    endpoint: str
    kv_endpoint: str
    layout: KVLayout
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., worker_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., kv_endpoint: _Optional[str] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("heartbeat_interval_s",)
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: float
    def __init__(self, heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "stats")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    stats: WorkerStats
    def __init__(self, worker_id: _Optional[str] = ..., stats: _Optional[_Union[WorkerStats, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

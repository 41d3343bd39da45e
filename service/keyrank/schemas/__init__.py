"""Wire format of the HTTP API: requests and responses, apart from any logic.

One module per dialect, like api/routes/: native.py, jina.py, cohere.py, tei.py, infinity.py,
openai.py, each with its error answer; common.py holds what they share, errors.py keyrank's own error.

These dialects map onto the same pipeline:
- ``POST /rerank``: keyrank's own shape (strategy, selector, evidence, timings);
- ``POST /v1/rerank``: Jina AI's rerank shape, and Cohere's v1 shape that extends it;
- ``POST /v2/rerank``: Cohere's v2 rerank shape;
- ``POST /tei/rerank``, ``GET /tei/info``: Hugging Face text-embeddings-inference's;
- ``POST /infinity/rerank``, ``GET /infinity/models``: Infinity's;
- ``GET /v1/models``: OpenAI's model list.

Each field's docstring is its description on the OpenAPI page
(``use_attribute_docstrings``). Requests are validated in strict mode: a value
of the wrong JSON type is an error, never coerced ("3" is not an integer).
keyrank's own shape rejects unknown fields; the vendor shapes accept them
(a newer SDK may send more) and the answer names them in
``X-Keyrank-Ignored-Fields``. Limits that depend on settings (documents per
request, characters per document and query) are not here: api/limits.py
checks them and the OpenAPI schema carries them as maxItems/maxLength
(api/app.py), so the message can name the setting that sets them.
"""

from keyrank.schemas.cohere import (
    CohereApiVersion,
    CohereBilledUnits,
    CohereErrorResponse,
    CohereMeta,
    CohereRerankRequest,
    CohereRerankResponse,
    VendorDocument,
    VendorDocumentOut,
    VendorResult,
)
from keyrank.schemas.common import Coverage, EvidenceSpan
from keyrank.schemas.errors import ErrorBody, ErrorResponse
from keyrank.schemas.infinity import (
    InfinityErrorResponse,
    InfinityModel,
    InfinityModels,
    InfinityRerankRequest,
    InfinityRerankResponse,
    InfinityResult,
    InfinityUsage,
)
from keyrank.schemas.jina import JinaUsage, V1ErrorResponse, V1RerankRequest, V1RerankResponse
from keyrank.schemas.native import (
    DocumentIn,
    DocumentOut,
    EvidenceOut,
    RerankRequest,
    RerankResponse,
    RerankResult,
    TimingsOut,
    UsageOut,
)
from keyrank.schemas.openai import ModelCard, ModelList
from keyrank.schemas.tei import TeiErrorResponse, TeiInfo, TeiRank, TeiRerankRequest, TeiRerankResponse

__all__ = [
    "CohereApiVersion", "CohereBilledUnits", "CohereErrorResponse", "CohereMeta", "CohereRerankRequest",
    "CohereRerankResponse", "Coverage", "DocumentIn", "DocumentOut", "ErrorBody", "ErrorResponse", "EvidenceOut",
    "EvidenceSpan", "InfinityErrorResponse", "InfinityModel", "InfinityModels", "InfinityRerankRequest",
    "InfinityRerankResponse", "InfinityResult", "InfinityUsage", "JinaUsage", "ModelCard", "ModelList",
    "RerankRequest", "RerankResponse", "RerankResult", "TeiErrorResponse", "TeiInfo", "TeiRank", "TeiRerankRequest",
    "TeiRerankResponse", "TimingsOut", "UsageOut", "V1ErrorResponse", "V1RerankRequest", "V1RerankResponse",
    "VendorDocument", "VendorDocumentOut", "VendorResult",
]

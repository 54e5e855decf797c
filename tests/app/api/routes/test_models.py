"""``GET /v1/models``: the named models' catalog, each entry with its source."""

from __future__ import annotations

from datarax.answers.catalog import NamedModelEntry, NamedModelList
from datarax.specs.named_models import MODELS
from tests.helpers import assert_problem


def test_models_are_listed_with_their_sources(api):
    response = api.get("/v1/models")
    assert response.status_code == 200
    items = {item["name"]: item for item in response.json()["items"]}
    names = ("llama2-7b", "llama2-13b", "llama2-70b", "llama3.1-8b", "llama3.1-70b",
             "llama3.1-405b", "mistral-7b", "gemma2-9b", "gemma2-27b", "gpt3-175b")  # fmt: skip
    for name in names:
        assert items[name]["source"] and items[name]["kind"] == "transformer", name
    one = api.get("/v1/models/llama3.1-70b")
    assert one.status_code == 200 and one.json() == items["llama3.1-70b"]
    # each answer is its class's JSON: the catalog's own entries, read back unchanged
    assert response.json() == NamedModelList(items=list(MODELS.values())).to_json()
    parsed = NamedModelList.from_json(response.json())
    assert all(isinstance(item, NamedModelEntry) for item in parsed.items)
    assert parsed.to_json() == response.json()
    assert "notes" not in one.json() and "num_experts" not in one.json()  # dense: omitted
    assert_problem(api.get("/v1/models/llama9"), 404, "model_not_found")

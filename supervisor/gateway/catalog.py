"""The names clients may send (a model's name, its aliases) and the name each engine knows
its model by: one mapping each, shared by the inference handler, the front door and the
model list, and replaced in place on a reload so that every holder sees the new config."""

from __future__ import annotations

import attrs

from adapters import model_apis, model_runtime
from supervisor.apis import Api
from supervisor.config import Config


@attrs.define(eq=False)
class ModelCatalog:
    aliases: dict[str, str] = attrs.Factory(dict)  # every accepted name -> its model
    served: dict[str, str] = attrs.Factory(dict)  # model -> the name its engine checks (vLLM's --served-model-name)
    apis: dict[str, frozenset[Api]] = attrs.Factory(dict)  # model -> the APIs it serves

    @classmethod
    def of(cls, config: Config) -> ModelCatalog:
        catalog = cls()
        catalog.replace(config)
        return catalog

    def replace(self, config: Config) -> None:
        aliases = config.alias_table()
        served = {name: model.served_name or name for name, model in config.models.items()
                  if model_runtime(model).checks_model_name}
        apis = {name: model_apis(model) for name, model in config.models.items()}
        # In place, names that go first: no moment in which a removed model is still routed.
        for table, new in ((self.aliases, aliases), (self.served, served), (self.apis, apis)):
            for name in [n for n in table if n not in new]:
                del table[name]
            table.update(new)

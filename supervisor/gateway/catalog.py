"""The names clients may send (a model's name, its aliases) and the name each engine knows
its model by: one mapping each, shared by the inference handler, the front door and the
model list, and replaced in place on a reload so that every holder sees the new config.
Image models (`runtime: comfyui`) are not engines: they have their own table, with their
workflows read from their files (and video models, those with a `video` section, another); nor are remote models (`runtime: remote`, gateway/cloud.py)."""

from __future__ import annotations

import attrs

from adapters import model_apis, model_runtime
from supervisor.apis import Api
from supervisor.config import Config, ImageModelConfig, RemoteModelConfig
from supervisor.gateway.relay.chunked import CUT_RUNTIME
from supervisor.gateway.relay.context_refusal import SlotConfig, slot_config
from supervisor.gateway.comfy.workflow import Workflow, load_workflow


@attrs.frozen
class ImageModel:
    name: str
    config: ImageModelConfig
    workflow: Workflow


@attrs.define(eq=False)
class ModelCatalog:
    aliases: dict[str, str] = attrs.Factory(dict)  # every accepted name -> its model
    served: dict[str, str] = attrs.Factory(dict)  # model -> the name its engine checks (vLLM's --served-model-name)
    apis: dict[str, frozenset[Api]] = attrs.Factory(dict)  # model -> the APIs it serves
    # model -> the steps of N tokens its lower-class generations are cut into (gateway/chunked.py):
    # scheduler.step_tokens on a runtime that continues a prefill (llama-server), else 0: never cut.
    step_tokens: dict[str, int] = attrs.Factory(dict)
    # model -> its slot context as its config sets it (llama-server's models): what a refusal of a
    # prompt too long for a slot names (gateway/relay/context_refusal.py).
    contexts: dict[str, SlotConfig] = attrs.Factory(dict)
    # model -> the models its fallback chain names (models.NAME.fallback); a model missing here has none.
    fallbacks: dict[str, tuple[str, ...]] = attrs.Factory(dict)
    # model -> the voices its config lists (a speech model's `voices`); a model missing here: any voice.
    voices: dict[str, tuple[str, ...]] = attrs.Factory(dict)
    images: dict[str, ImageModel] = attrs.Factory(dict)  # every accepted image model name -> its model
    videos: dict[str, ImageModel] = attrs.Factory(dict)  # every accepted video model name (a video section) -> its model
    remote: dict[str, str] = attrs.Factory(dict)  # every accepted remote model name -> its model
    remote_models: dict[str, RemoteModelConfig] = attrs.Factory(dict)  # remote model -> its config
    # Every accepted name, of an engine's model or an image model -> its model: what a key's
    # model list is read with (a key may name an alias).
    names: dict[str, str] = attrs.Factory(dict)

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
        step_tokens = {name: config.scheduler.step_tokens if model.runtime == CUT_RUNTIME else 0
                       for name, model in config.models.items()}
        contexts = {name: context for name, model in config.models.items()
                    if (context := slot_config(name, model)) is not None}
        fallbacks = {name: tuple(route.model for route in model.fallback) for name, model in config.models.items()
                     if model.fallback}
        voices = {name: tuple(model.voices) for name, model in config.models.items() if model.voices is not None}
        comfy = _image_models(config)
        images = {alias: model for alias, model in comfy.items() if model.config.video is None}
        videos = {alias: model for alias, model in comfy.items() if model.config.video is not None}
        remote = config.remote_alias_table()
        names = {**aliases, **{alias: model.name for alias, model in comfy.items()}, **remote}
        # In place, names that go first: no moment in which a removed model is still routed.
        for table, new in ((self.aliases, aliases), (self.served, served), (self.apis, apis),
                           (self.step_tokens, step_tokens), (self.contexts, contexts), (self.fallbacks, fallbacks),
                           (self.voices, voices), (self.images, images), (self.videos, videos),
                           (self.remote, remote), (self.remote_models, config.remote_models), (self.names, names)):
            for name in [n for n in table if n not in new]:
                del table[name]
            table.update(new)


def _image_models(config: Config) -> dict[str, ImageModel]:
    """Each accepted name of an image model -> the model, its workflow read now (load_config
    checked the files; one that cannot be read any more is left out: its name is unknown)."""
    models = {}
    for name, model in config.image_models.items():
        try:
            models[name] = ImageModel(name, model, load_workflow(model.workflow))
        except ValueError:
            continue
    return {alias: models[name] for alias, name in config.image_alias_table().items() if name in models}

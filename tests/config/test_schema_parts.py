"""What the config's own dataclasses hand the assembly: a scheme's parameters
(``PartitionConfig.scheme_params``) and the stated normalisation
(``TransformConfig.normalisation``, refused at load when half or ill-formed)."""

from __future__ import annotations

import pytest

from osfl.config import load_config
from osfl.config.schema import PartitionConfig, TransformConfig
from osfl.errors import ConfigError


def test_a_scheme_gets_only_the_named_fields_it_takes_and_every_explicit_option() -> None:
    p = PartitionConfig(alpha=0.3, min_partition_size=4, options={"shards": 2})
    assert p.params() == {"alpha": 0.3, "min_partition_size": 4, "shards": 2}
    assert p.scheme_params({"alpha"}) == {"alpha": 0.3, "shards": 2}
    assert p.scheme_params(set()) == {"shards": 2}  # iid takes no alpha; options go as given
    assert PartitionConfig().scheme_params({"alpha"}) == {}  # unset fields are never passed


def test_the_stated_normalisation_is_both_tuples_or_none() -> None:
    assert TransformConfig().normalisation() is None
    tf = TransformConfig(mean=[0.5, 0.4], std=[0.2, 0.1])
    assert tf.normalisation() == ((0.5, 0.4), (0.2, 0.1))


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["transform.mean=[0.5]"], "give both transform.mean and transform.std"),
        (["transform.std=[0.5]"], "give both transform.mean and transform.std"),
        (["transform.mean=[0.5,0.5]", "transform.std=[0.2]"], "one value per channel"),
        (["transform.mean=[0.5]", "transform.std=[0.0]"], "std > 0"),
    ],
)
def test_a_half_or_bad_normalisation_is_refused_when_the_config_loads(overrides, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(None, overrides)

"""rlkit/agents/observations.py: which observations become images, in what layout they reach
the CNN, and the packages imported for an environment id (rlkit/envs/packages.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlkit.core as rc
from rlkit.agents import DQN
from rlkit.agents.dqn import DQNConfig
from rlkit.agents.observations import Identity, ImageEncoder, ObservationLayout, is_image_space
from rlkit.envs import ATARI_DQN_DEFAULTS
from rlkit.envs.packages import register_for

ATARI_STACK = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
RGB_LAST = gym.spaces.Box(0, 255, (64, 48, 3), np.uint8)
MINATAR = gym.spaces.Box(0.0, 1.0, (10, 10, 4), bool)


def test_image_spaces_are_what_sb3_calls_images():
    assert is_image_space(ATARI_STACK) and is_image_space(RGB_LAST)
    assert not is_image_space(MINATAR)  # booleans: not bytes in [0, 255]
    assert not is_image_space(gym.spaces.Box(0, 255, (84, 84), np.uint8))  # two dimensions
    assert not is_image_space(gym.spaces.Box(0, 1, (4, 84, 84), np.uint8))  # other bounds
    assert not is_image_space(gym.spaces.Box(0.0, 255.0, (4, 84, 84), np.float32))


def test_layouts():
    atari = ObservationLayout.of(ATARI_STACK)
    assert (atari.image, atari.extractor, atari.channels_first, atari.dtype) == (True, "nature", True, np.uint8)
    assert atari.scale == pytest.approx(1 / 255) and atari.buffer_shape == (4, 84, 84)
    rgb = ObservationLayout.of(RGB_LAST, "impala")
    assert not rgb.channels_first and rgb.channel_first_shape == (3, 64, 48)
    assert ObservationLayout.of(ATARI_STACK, normalize_images=False).scale == 1.0
    flat = ObservationLayout.of(ATARI_STACK, "flatten")
    assert not flat.image and flat.buffer_shape == 4 * 84 * 84 and flat.dtype == np.float32
    minatar = ObservationLayout.of(MINATAR)  # not an image unless asked for
    assert not minatar.image
    forced = ObservationLayout.of(MINATAR, "impala")
    assert forced.image and forced.scale == 1.0 and not forced.channels_first and forced.dtype == np.uint8
    batch = forced.batch(np.ones((2, 10, 10, 4), bool), 2)
    assert batch.dtype == np.uint8 and batch.shape == (2, 10, 10, 4)


def test_bad_layouts():
    with pytest.raises(ValueError, match="features_extractor must be one of"):
        ObservationLayout.of(ATARI_STACK, "resnet")
    with pytest.raises(ValueError, match="needs an image observation space"):
        ObservationLayout.of(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), "nature")
    with pytest.raises(ValueError, match="needs an image observation space"):
        ObservationLayout.of(gym.spaces.Box(-1.0, 1.0, (3, 8, 8), np.float32), "impala")
    with pytest.raises(ValueError, match="DQNConfig: features_extractor must be one of"):
        DQNConfig(features_extractor="cnn")
    with pytest.raises(ValueError, match="features_extractor_kwargs must be a dict"):
        DQNConfig(features_extractor_kwargs=[("features_dim", 128)])


@pytest.mark.parametrize("space", [ATARI_STACK, RGB_LAST, MINATAR], ids=["channel-first", "channel-last", "minatar"])
def test_images_reach_the_cnn_as_w_h_c_n_floats(space, device):
    layout = ObservationLayout.of(space, "impala")
    encoder = ImageEncoder(layout, Identity())  # the CNN's input itself
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256 if space.dtype == np.uint8 else 2, (3, *space.shape)).astype(np.uint8)  # (N, *shape)
    with rc.no_grad():
        images = encoder(rc.tensor(layout.batch(obs, 3).T, dtype="u8", device=device)).numpy()
    chw = obs if layout.channels_first else obs.transpose(0, 3, 1, 2)  # (N, C, H, W)
    np.testing.assert_allclose(images, chw.T * layout.scale, rtol=1e-6)  # [W, H, C, N]


def test_atari_ids_get_rl_zoo_settings_and_other_ids_the_defaults():
    pytest.importorskip("ale_py", reason="the atari extra is part of the test extra")
    config = DQN.default_config("ALE/Pong-v5")
    for name, value in ATARI_DQN_DEFAULTS.items():
        assert getattr(config, name) == value
    assert config.net_arch == ()  # the head right on NatureCNN's features, as SB3's CnnPolicy
    assert DQN.default_config("Acrobot-v1") == DQN.config_class()  # (CartPole-v1's: tests/test_dqn.py)


def test_the_package_of_an_id_is_imported_for_it():
    pytest.importorskip("minatar", reason="the minatar extra is part of the test extra")
    register_for("MinAtar/Breakout-v1")
    assert "MinAtar/Breakout-v1" in gym.registry
    register_for("CartPole-v1")  # registered already, or another namespace: nothing to import
    register_for("NoSuchNamespace/Thing-v0")
    with pytest.raises(gym.error.Error):
        gym.make("NoSuchNamespace/Thing-v0")

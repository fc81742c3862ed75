import pytest

from paxlike.trainer import throughput


def test_mfu_is_flops_over_time_over_peak():
  out = throughput.throughput_metrics(steps_per_sec=4.0, items_per_step=2048, item_name='tokens',
                                      flops_per_device=3e12, num_devices=8, peak_per_device=100e12)
  assert out['tokens_per_sec'] == 8192.0
  assert out['tflops_per_sec'] == pytest.approx(3e12 * 4 * 8 / 1e12)
  assert out['mfu'] == pytest.approx(3e12 / (1 / 4.0) / 100e12)


def test_no_mfu_without_a_known_peak():
  out = throughput.throughput_metrics(2.0, 10, 'examples', 1e9, 1, None)
  assert set(out) == {'examples_per_sec', 'tflops_per_sec'}
  assert throughput.peak_flops_per_sec('cpu') is None


@pytest.mark.parametrize('kind, peak', [('TPU v4', 275e12), ('TPU v5 lite', 197e12),
                                        ('TPU v5p', 459e12), ('NVIDIA H100 80GB HBM3', 989e12),
                                        ('NVIDIA H200', 989e12)])
def test_peak_table(kind, peak):
  assert throughput.peak_flops_per_sec(kind) == peak


@pytest.mark.slow  # Compiles a federated train step.
def test_lm_step_flops_count_every_client_and_local_step():
  from paxlike import registry
  from paxlike.families import lm_flops
  from paxlike.config import config_io
  from paxlike.trainer import build
  registry.import_all()
  cfg = registry.get('federated.ShakespeareFedAvg')().config()
  config_io.apply_overrides(cfg, ['data.clients_per_round=2'])
  task = config_io.build(cfg)
  s = build.setup(task)
  tokens = 2 * 4 * task.data.batch_size * task.data.seq_len  # clients × local steps × batch × seq
  expected = lm_flops.flops_per_token(task.model, task.data.seq_len) * tokens
  assert (s.reporters.item, s.reporters.items_per_step) == ('tokens', tokens)
  assert s.reporters.flops_per_device == pytest.approx(expected)


def test_classifier_step_flops_count_every_client_and_local_step():
  """An MLP's training FLOPs from its shapes: forward 2·in·out per layer, backward the weight
  gradients (2·in·out) and the input gradients of every layer but the first."""
  from paxlike import registry
  from paxlike.config import config_io
  from paxlike.trainer import build
  registry.import_all()
  cfg = registry.get('federated.DigitsFedAvg')().config()
  config_io.apply_overrides(cfg, ['model.hidden=(32, 16)'])
  task = config_io.build(cfg)
  s = build.setup(task)
  layers = [(64, 32), (32, 16), (16, 10)]  # 8x8 digits → 32 → 16 → 10 classes.
  per_example = sum(4 * i * o for i, o in layers) + sum(2 * i * o for i, o in layers[1:])
  examples = 5 * 5 * task.data.batch_size  # clients × local steps × batch
  assert (s.reporters.item, s.reporters.items_per_step) == ('examples', examples)
  assert s.reporters.flops_per_device == pytest.approx(per_example * examples, rel=0.1)

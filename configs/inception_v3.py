"""Inception-v3 on ImageNet-style data, streamed from host workers; distortions on device.

  ./launch.sh configs/inception_v3.py --config.data_dir=DIR      # ImageNet (tfds, array_record)
  ./launch.sh configs/inception_v3.py:imagenette                 # small real dataset (10 classes)
  ./launch.sh configs/inception_v3.py:synthetic                  # throughput benchmark
  ./launch.sh configs/inception_v3.py:synthetic,bf16             # ... in bfloat16
  ./launch.sh configs/inception_v3.py:smoke                      # tiny, seconds on CPU (tests)

The paper's recipe: RMSProp (decay 0.9, momentum 0.9, epsilon 1.0 inside the square root, as
TF's RMSProp), learning rate 0.045 decayed by 0.94 every 2 epochs, label smoothing 0.1,
gradient clipping at global norm 2.0, batch 32 per device, auxiliary head weighted 0.4.
The paper ran 50 asynchronous replicas of batch 32; synchronous data parallelism has no
exact equivalent, so 0.045 is taken at the global batch 256 (8 devices × 32) and scaled
linearly with batch_size / 256, with 2 warm-up epochs for stability at larger batches.

Data: `imagenet2012` / `imagenette` prepared by tfds as array_record
(`tfds build imagenet2012 --data_dir=DIR --file_format=array_record`), read without
TensorFlow, or the ILSVRC2012 JPEG folders (`--config.dataset=folder --config.data_dir=DIR`
with DIR/train/<synset>/*.JPEG and DIR/val/<synset>/*.JPEG). Host workers only decode each
image and resize its longer side to host_image_size (padded to a square, valid size sent
along); the random crop (sampled inside the true image as sample_distorted_bounding_box
does), flip and colour distortion run on device.
"""

from configs.common import apply_variant, training_defaults


def _imagenette(c):
  c.dataset, c.model.num_classes = "imagenette", 10
  c.num_epochs = 60


def _synthetic(c):
  c.dataset = "synthetic"  # device-resident generated images: no host work per step
  c.synthetic_image_size = c.host_image_size
  c.synthetic_train_size, c.synthetic_test_size = 2048, 256
  c.eval_batch_size = 256
  c.num_train_steps, c.log_every_steps = 200, 50


def _smoke(c):
  c.dataset = "synthetic"
  c.host_image_size = c.synthetic_image_size = 88
  c.synthetic_train_size, c.synthetic_test_size = 256, 40
  c.synthetic_noise = 0.2
  # Inception's ops at 75 (the smallest input), but mild: at full strength the colour distortion
  # hides the synthetic classes (colour templates) so well that train accuracy is ~0.3 at step 100.
  c.augment = "inception_crop(75, 0.5)|flip_lr|color_distort(0.02, 0.1, 0.02, 0.1)|scale(-1, 1)"
  c.eval_preprocess = "central_crop(75)|scale(-1, 1)"
  c.model.width, c.model.aux_logits, c.model.num_classes = 0.125, False, 10
  c.model.blocks = (1, 1, 1)  # each block type once: less than half the program to compile
  c.model.bn_momentum = 0.5  # eval's running statistics must keep up with fast-moving weights
  c.batch_size, c.eval_batch_size = 32, 32
  c.keep_freed_host_memory = False  # compile-bound (research/fields.py)
  c.num_train_steps, c.log_every_steps = 16, 8
  # Epsilon 1.0 makes RMSProp plain SGD; at init the gradient norm is ~250, mostly the stem's,
  # so clipped SGD steps barely move the rest. A small epsilon scales each parameter's step.
  c.rms_eps = 1e-4
  c.learning_rate, c.warmup_epochs, c.label_smoothing = 0.024, 0.0, 0.0  # 0.003 at batch 32
  c.lr_decay_rate = 0.5  # halved every 2 epochs (16 steps)


VARIANTS = {
  "imagenette": _imagenette,
  "synthetic": _synthetic,
  "bf16": lambda c: c.model.update(dtype="bfloat16"),
  "smoke": _smoke,
}


def get_config(arg=None):
  c = training_defaults()
  c.dataset = "imagenet2012"
  c.model = dict(
    name="inception_v3",
    num_classes=1000,
    aux_logits=True,  # auxiliary classifier on the 17×17 features
    dropout_rate=0.2,  # slim's keep probability 0.8
    bn_momentum=0.9997,  # slim's batch_norm_decay
    width=1.0,  # channel multiplier; 1.0 = the paper
    blocks=(3, 4, 2),  # Inception-A, -B, -C blocks at 35×35, 17×17, 8×8; (3, 4, 2) = the paper
    dtype="float32",  # "bfloat16" compute on GPUs; params and BatchNorm stats stay float32
  )
  c.loss = "auxiliary_cross_entropy"  # + aux_loss_weight (0.4) × the auxiliary head's
  c.data_placement = "streamed"  # dataset=folder: ImageNet-sized folders never fit on devices
  c.host_image_size = 320  # pixels: host workers resize each image's LONGER side to this
  c.data_workers = 8  # host decode processes (grain); 0 = decode in the training process
  c.batch_size = 256  # global: 32 per device on 8 devices
  c.eval_batch_size = 512
  c.num_epochs = 100
  c.optimizer, c.learning_rate, c.lr_batch_size = "rmsprop", 0.045, 256
  c.rms_decay, c.momentum, c.rms_eps, c.rms_eps_in_sqrt = 0.9, 0.9, 1.0, True
  c.schedule, c.lr_decay_rate, c.lr_decay_epochs = "exponential", 0.94, 2.0
  c.warmup_epochs = 2.0
  c.label_smoothing = 0.1
  c.grad_clip_norm = 2.0
  c.weight_decay = 4e-5  # slim's weight decay on conv/dense kernels
  c.aux_loss_weight = 0.4
  c.augment = "inception_crop(299)|flip_lr|color_distort|scale(-1, 1)"
  c.eval_preprocess = "central_crop(299, 0.875)|scale(-1, 1)"
  c.eval_every_steps = 5000
  c.checkpoint_every_steps = 2000
  apply_variant(c, arg, VARIANTS)
  return c

// Device basics (src/cuda/device.cu): buffers, error reporting, streams, weight upload in the
// stored form. Skipped without a CUDA device (ctest label "gpu").
#include <string>

#include "core/error.h"
#include "test_cuda_util.h"

using namespace dsv4;
using namespace dsv4::testing;

namespace {
class CudaDevice : public GpuTest {};
}  // namespace

TEST_F(CudaDevice, SummaryNamesTheDevice) {
  const std::string s = gpu::device_summary();
  EXPECT_NE(s.find("sm_"), std::string::npos) << s;
  std::printf("device: %s\n", s.c_str());
}

TEST_F(CudaDevice, BufferRoundTripAndRanges) {
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  gpu::DeviceBuffer b(bytes.size());
  EXPECT_EQ(b.bytes(), bytes.size());
  b.upload(bytes.data(), bytes.size());
  std::vector<uint8_t> back(bytes.size());
  b.download(back.data(), back.size());
  EXPECT_EQ(back, bytes);
  // Partial copies at an offset.
  const uint8_t patch[3] = {1, 2, 3};
  b.upload(patch, 3, 500);
  uint8_t got[5];
  b.download(got, 5, 499);
  EXPECT_EQ(got[0], bytes[499]);
  EXPECT_EQ(got[1], 1);
  EXPECT_EQ(got[3], 3);
  EXPECT_EQ(got[4], bytes[503]);
  EXPECT_THROW(b.upload(bytes.data(), 10, 995), Error);
  EXPECT_THROW(b.download(back.data(), 1001), Error);
  // Moves transfer ownership.
  gpu::DeviceBuffer c = std::move(b);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(c.bytes(), bytes.size());
  c.fill_zero();
  c.download(back.data(), back.size());
  for (uint8_t v : back) EXPECT_EQ(v, 0);
}

TEST_F(CudaDevice, CudaFailureBecomesErrorNamingTheCall) {
  try {
    gpu::DeviceBuffer huge(size_t{1} << 62);
    FAIL() << "allocating 4 EiB succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaMalloc"), std::string::npos) << what;
    EXPECT_NE(what.find("CUDA error"), std::string::npos) << what;
  }
  // The runtime is still usable afterwards.
  gpu::DeviceBuffer ok(64);
  ok.fill_zero();
}

TEST_F(CudaDevice, StreamsRunOps) {
  gpu::Stream s = gpu::create_stream();
  const std::vector<float> a = {1, 2, 3, 4}, b = {10, 20, 30, 40};
  gpu::DeviceBuffer da = dev(a), db = dev(b), dy(16);
  gpu::add(da.as<float>(), db.as<float>(), dy.as<float>(), 4, s);
  gpu::synchronize(s);
  EXPECT_EQ(gpu::to_host<float>(dy, 4), (std::vector<float>{11, 22, 33, 44}));
  gpu::destroy_stream(s);
}

// The device holds the checkpoint's bytes: payload rows (at a 16-byte pitch) and the scale
// tensor unchanged, nothing dequantised.
TEST_F(CudaDevice, UploadKeepsStoredBytes) {
  uint32_t seed = 1;
  for (WFormat f : kAllFormats) {
    const bool fp4 = f == WFormat::MXFP4 || f == WFormat::NVFP4;
    for (int64_t cols : {fp4 ? int64_t{98} : int64_t{97}, int64_t{256}}) {
      const OwnedWeight o = make_weight(f, 131, cols, seed++);
      const gpu::DeviceWeight d = gpu::upload_weight(o.w);
      const int64_t rb = static_cast<int64_t>(o.data.size()) / o.w.rows;
      EXPECT_EQ(d.pitch, cdiv(rb, 16) * 16);
      EXPECT_EQ(d.rows, o.w.rows);
      EXPECT_EQ(d.cols, o.w.cols);
      EXPECT_EQ(d.scale_cols, o.w.scale_cols);
      EXPECT_EQ(d.scale2, o.w.scale2);
      const std::vector<uint8_t> pay = gpu::to_host<uint8_t>(d.data, static_cast<size_t>(d.pitch * d.rows));
      int bad = 0;
      for (int64_t r = 0; r < o.w.rows; ++r)
        for (int64_t i = 0; i < d.pitch; ++i) {
          const uint8_t want = i < rb ? o.data[r * rb + i] : 0;  // the pad is zero
          if (pay[r * d.pitch + i] != want) ++bad;
        }
      EXPECT_EQ(bad, 0) << wformat_name(f) << " cols " << cols;
      if (!o.scale.empty()) {
        EXPECT_EQ(d.scale.bytes(), o.scale.size());
        EXPECT_EQ(gpu::to_host<uint8_t>(d.scale, o.scale.size()), o.scale) << wformat_name(f);
      } else {
        EXPECT_TRUE(d.scale.empty());
      }
    }
  }
}

TEST_F(CudaDevice, UploadRejectsInconsistentWeights) {
  OwnedWeight o = make_weight(WFormat::FP8Block, 10, 300, 3);
  o.w.scale_cols = 2;  // 300 columns need 3 block columns
  EXPECT_THROW(gpu::upload_weight(o.w), Error);
  o.w.scale_cols = 3;
  o.w.scale = nullptr;
  EXPECT_THROW(gpu::upload_weight(o.w), Error);
  QWeight empty;
  EXPECT_THROW(gpu::upload_weight(empty), Error);
}

// Certificate rotation on the public port without a restart (--tls-reload-interval): the
// certificate and key files are swapped on a running server; new connections get the new
// certificate, a stream open across the swap finishes, no call fails. Certificates are made at
// test time with deploy/local/fleet_certs.sh (openssl).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/unit/rpc/rpc_test_util.h"

namespace orthoserve::testing {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class TlsReloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/tls_reload_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
    const std::string script = ORTHOSERVE_FLEET_CERTS_SCRIPT;
    ASSERT_EQ(std::system((script + " ca " + dir_).c_str()), 0);
    for (const char* name : {"first", "second"}) {
      ASSERT_EQ(std::system(absl::StrCat(script, " cert ", dir_, " ", name, " DNS:localhost").c_str()), 0);
    }
    Install("first");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Puts certificate `name` where the server reads its files, as a Secret update does: the new
  // files are written aside and renamed over the old ones.
  void Install(const std::string& name) {
    for (const char* ext : {"crt", "key"}) {
      std::filesystem::copy_file(absl::StrCat(dir_, "/", name, ".", ext), absl::StrCat(dir_, "/serving.", ext, ".new"),
                                 std::filesystem::copy_options::overwrite_existing);
    }
    // Key first, then the certificate: the watcher may read between the two renames, and takes
    // only a pair whose key matches.
    std::filesystem::rename(dir_ + "/serving.key.new", dir_ + "/serving.key");
    std::filesystem::rename(dir_ + "/serving.crt.new", dir_ + "/serving.crt");
  }

  // A new TLS channel's stub (a new connection), trusting the test CA for "localhost".
  std::unique_ptr<v1::Orthogonalizer::Stub> NewStub(const Server& server) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = Read(dir_ + "/ca.crt");
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    args.SetInt("grpc.use_local_subchannel_pool", 1);  // Its own connection, not a shared one.
    return v1::Orthogonalizer::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(server.port()), grpc::SslCredentials(ssl), args));
  }

  // The common name of the certificate the server presented on `stub`'s connection (after a call).
  std::string ServedName(v1::Orthogonalizer::Stub& stub) {
    grpc::ClientContext context;
    v1::ServerInfo info;
    const grpc::Status status = stub.GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    EXPECT_TRUE(status.ok()) << status.error_message();
    const std::vector<grpc::string_ref> names = context.auth_context()->FindPropertyValues("x509_common_name");
    return names.empty() ? "" : std::string(names[0].data(), names[0].size());
  }

  std::string dir_;
};

TEST_F(TlsReloadTest, NewConnectionsGetTheSwappedCertificateAndNoCallFails) {
  ServerOptions options = TestServerOptions();
  options.tls_cert = dir_ + "/serving.crt";
  options.tls_key = dir_ + "/serving.key";
  options.tls_reload_interval = absl::Seconds(1);
  auto server = Server::Create(options);
  ASSERT_OK(server);
  auto before = NewStub(**server);
  EXPECT_EQ(ServedName(*before), "first");

  // A stream opened before the swap, finished after it.
  grpc::ClientContext stream_context;
  auto stream = before->OrthogonalizeStream(&stream_context);
  ASSERT_TRUE(stream->Write(HeaderMessage(1)));
  Install("second");
  // The watcher reads every second: a new connection gets the new certificate within a few.
  std::string served;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    served = ServedName(*NewStub(**server));
    if (served == "second") break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(served, "second");
  std::vector<v1::StreamRequest> rest;
  AppendMatrix(rest, 0, Spec("w", {4, 4}, DType::kF32, NsOptions()), Bytes(RandomMatrix(4, 4, 2), DType::kF32));
  rest.push_back(EndMessage());
  for (const v1::StreamRequest& m : rest) ASSERT_TRUE(stream->Write(m));
  stream->WritesDone();
  v1::StreamResponse response;
  int results = 0;
  while (stream->Read(&response)) results += response.has_result() ? 1 : 0;
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(results, 1);
  // The old connection goes on with its certificate.
  EXPECT_EQ(ServedName(*before), "first");
}

TEST_F(TlsReloadTest, AReloadIntervalUnderASecondIsRefused) {
  ServerOptions options = TestServerOptions();
  options.tls_cert = dir_ + "/serving.crt";
  options.tls_key = dir_ + "/serving.key";
  options.tls_reload_interval = absl::Milliseconds(500);
  EXPECT_THAT(Server::Create(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("--tls-reload-interval")));
}

}  // namespace
}  // namespace orthoserve::testing

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("documents", "0005_document_dispatched_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="document",
            name="reader",
            field=models.UUIDField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="document",
            name="read_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
